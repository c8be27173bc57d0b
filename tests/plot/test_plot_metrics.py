#!/usr/bin/python3
"""scripts/plot_metrics on the metrics file of a real run: a tiny model trained for 12 steps
with validation every 4 must give a PNG (its signature, its size as drawn) titled by the run's
directory and a summary naming 12 steps and 4 validations (before training, as step 0, and
after steps 4, 8, 12); a file with no step lines must be refused. Two files in one plot work
too.

Exit 77 (skipped) where /usr/bin/python3 has no matplotlib (Debian's python3-matplotlib).
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from mpi_harness import check, failures, losses, tiny_run, write_shard  # noqa: E402


def png_size(path):
    """(width, height) from a PNG's IHDR chunk, or None when it is not a PNG."""
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--trident", required=True)
    parser.add_argument("--source-dir", required=True)
    a = parser.parse_args()
    if subprocess.run(["/usr/bin/python3", "-c", "import matplotlib"],
                      stderr=subprocess.DEVNULL).returncode != 0:
        print("SKIP: /usr/bin/python3 has no matplotlib (Debian's python3-matplotlib)")
        return 77
    plot = os.path.join(a.source_dir, "scripts", "plot_metrics")

    with tempfile.TemporaryDirectory() as tmp:
        valid = os.path.join(tmp, "valid.bin")
        write_shard(valid, [(i * 31 + (i * i) % 37) % 300 for i in range(1000)])
        metrics = os.path.join(tmp, "run", "metrics.jsonl")
        args = tiny_run(tmp, ["training.steps=12", f"data.valid={valid}",
                              "training.eval_interval=4", f"logging.metrics={metrics}"])
        subprocess.run([a.trident, "train"] + args, check=True, stdout=subprocess.DEVNULL,
                       timeout=300)
        rows = losses(metrics)
        with open(metrics) as f:
            validations = [json.loads(line) for line in f if "val_loss" in line]
        validated = len(validations)
        check(len(rows) == 12 and [r["step"] for r in validations] == [0, 4, 8, 12]
              and "loss" not in validations[0],
              f"the run wrote 12 steps and 4 validations, the first before training as step 0 "
              f"({len(rows)}, {[r['step'] for r in validations]})")

        p = subprocess.run([plot, metrics], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=120)
        print(p.stdout, end="")
        png = os.path.join(tmp, "run", "metrics.png")
        check(p.returncode == 0 and f"{len(rows)} steps (1..12), {validated} validations" in p.stdout,
              "plot_metrics read every step and validation")
        check(f'titled "{os.path.dirname(metrics)}"' in p.stdout, "the title names the run")
        check(png_size(png) == (900, 500), f"{png}: a 900 x 500 PNG beside the metrics file "
                                           f"({png_size(png) if os.path.exists(png) else 'missing'})")

        # A second run in the same plot, and a named output.
        other = os.path.join(tmp, "other", "metrics.jsonl")
        subprocess.run([a.trident, "train"] + args + ["--set", "training.lr=1e-3", "--set",
                       f"logging.metrics={other}"], check=True, stdout=subprocess.DEVNULL,
                       timeout=300)
        both = os.path.join(tmp, "both.png")
        p = subprocess.run([plot, metrics, other, "-o", both, "--smooth", "3", "--title", "lr"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
        check(p.returncode == 0 and png_size(both) is not None, "two runs in one PNG (-o, --smooth)")

        # A run still writing may leave half a line; anything else that is not JSON is an error.
        with open(metrics) as f:
            text = f.read()
        cut = os.path.join(tmp, "cut.jsonl")
        with open(cut, "w") as f:
            f.write(text + '{"step": 13, "lo')
        p = subprocess.run([plot, cut, "-o", os.path.join(tmp, "cut.png")], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=120)
        check(p.returncode == 0 and "12 steps" in p.stdout, "a half-written last line is left out")
        empty = os.path.join(tmp, "empty.jsonl")
        with open(empty, "w") as f:
            f.write('{"note": "no steps"}\n')
        p = subprocess.run([plot, empty], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=120)
        check(p.returncode != 0 and "no step lines" in p.stdout
              and not os.path.exists(os.path.join(tmp, "empty.png")),
              f"a file without step lines is refused: {p.stdout.strip()}")

    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
