#!/usr/bin/python3
"""scripts/plot_metrics on the metrics file of a real run: a tiny model trained for 12 steps
with validation every 4 must give a PNG (its signature, its size as drawn) titled by the run's
directory and a summary naming 12 steps and 4 validations (before training, as step 0, and
after steps 4, 8, 12); a file with no step lines must be refused. Two files in one plot work
too.

And what the figure shows, read from the figure plot_metrics draws (its `draw`): the
validation losses as points, no line joining them (nothing is known between them); the steps
as whole numbers on the x axis; `--log`, a logarithmic loss axis; with several runs one legend,
below the axes and clear of them; a resumed run's resume marked at its step.

Exit 77 (skipped) where /usr/bin/python3 has no matplotlib (Debian's python3-matplotlib).
"""
import argparse
import importlib.machinery
import importlib.util
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


def load_plot_metrics(path):
    """scripts/plot_metrics as a module (its name has no .py)."""
    loader = importlib.machinery.SourceFileLoader("plot_metrics", path)
    spec = importlib.util.spec_from_loader("plot_metrics", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def check_figure(plot, runs, log):
    """The figure's content: see the module's text."""
    options = type("Options", (), {"smooth": 0, "log": log, "title": None})
    fig = plot.draw([(path, plot.read_metrics(path)) for path in runs], options)
    fig.canvas.draw()
    loss_axis = fig.axes[0]
    val = [line for line in loss_axis.get_lines() if line.get_label().endswith("val loss")]
    check(len(val) == len(runs) and all(line.get_linestyle() == "None" and
                                        line.get_marker() == "o" for line in val),
          f"validation losses drawn as points, no line between them ({len(val)} runs)")
    low, high = loss_axis.get_xlim()
    ticks = [t for t in loss_axis.get_xticks() if low <= t <= high]
    check(ticks and all(float(t).is_integer() for t in ticks), f"whole steps on the x axis {ticks}")
    check(loss_axis.get_yscale() == ("log" if log else "linear"),
          f"the loss axis is {'logarithmic' if log else 'linear'}")
    legends = fig.legends + [a.get_legend() for a in fig.axes if a.get_legend()]
    renderer = fig.canvas.get_renderer()
    box = legends[0].get_window_extent(renderer) if legends else None
    clear = box is not None and not box.overlaps(loss_axis.get_window_extent(renderer))
    check(len(legends) == 1 and clear, "one legend, clear of the axes")
    return fig


def check_resume(a, plot, tmp, args):
    """A run resumed at step 4 with more steps (its schedule reshaped): the resume marked."""
    ck = os.path.join(tmp, "resumed")
    metrics = os.path.join(ck, "metrics.jsonl")
    for steps in (4, 8):
        subprocess.run([a.trident, "train"] + args + [
            "--set", f"training.steps={steps}", "--set", f"checkpoint.dir={ck}",
            "--set", f"logging.metrics={metrics}"], check=True, stdout=subprocess.DEVNULL,
            timeout=300)
    rows = plot.read_metrics(metrics)
    check([r.get("resumed_at") for r in rows if "resumed_at" in r] == [4]
          and [r["step"] for r in rows if "resumed_at" in r] == [5],
          "the first step after the resume records resumed_at 4")
    fig = check_figure(plot, [metrics], False)
    axis = fig.axes[0]
    marks = [line for line in axis.get_lines() if list(line.get_xdata()) == [4, 4]]
    texts = [t.get_text() for t in axis.texts]
    check(len(marks) == 1 and "resumed at step 4" in texts,
          f"the resume marked at step 4 ({texts})")


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
        module = load_plot_metrics(plot)
        check_figure(module, [metrics], False)
        check_figure(module, [metrics], True)
        p = subprocess.run([plot, metrics, "--log", "-o", os.path.join(tmp, "log.png")],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
        check(p.returncode == 0 and png_size(os.path.join(tmp, "log.png")) == (900, 500),
              "--log writes its PNG")

        # A second run in the same plot, and a named output.
        other = os.path.join(tmp, "other", "metrics.jsonl")
        subprocess.run([a.trident, "train"] + args + ["--set", "training.lr=1e-3", "--set",
                       f"logging.metrics={other}"], check=True, stdout=subprocess.DEVNULL,
                       timeout=300)
        both = os.path.join(tmp, "both.png")
        p = subprocess.run([plot, metrics, other, "-o", both, "--smooth", "3", "--title", "lr"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
        check(p.returncode == 0 and png_size(both) is not None, "two runs in one PNG (-o, --smooth)")
        check_figure(module, [metrics, other], False)
        check_resume(a, module, tmp, args)

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
