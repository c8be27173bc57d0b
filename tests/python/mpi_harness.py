"""What the multi-rank layout tests share: running trident under mpirun, reading the
gradient dumps (safetensors, F32), metrics files and checkpoints, comparing, and writing tiny
data.

Standard library only.
"""
import argparse
import array
import json
import os
import shutil
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint_compare  # noqa: E402
from checkpoint_compare import KINDS  # noqa: E402

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def mpirun_env():
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    return env


def run(cmd, ranks=None, expect_ok=True):
    if ranks is not None:
        cmd = [shutil.which("mpirun"), "--oversubscribe", "-np", str(ranks)] + cmd
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=mpirun_env(), timeout=600)
    if expect_ok and p.returncode != 0:
        print(p.stdout)
        raise SystemExit(f"command failed ({p.returncode}): {' '.join(cmd)}")
    return p


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", info
        b, e = info["data_offsets"]
        tensors[name] = array.array("f", data[b:e])
    return tensors


def rel_diff(a, b):
    """The largest difference of a and b relative to b's largest magnitude; infinite where
    their lengths differ (zip would stop at the shorter)."""
    if len(a) != len(b):
        return float("inf")
    scale = max((abs(x) for x in b), default=0.0) or 1.0
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0) / scale


def worst(rows, ref, key):
    """The largest relative difference of `key` between two runs' step records; infinite
    where the lengths differ."""
    if len(rows) != len(ref) or not ref:
        return float("inf")
    return max(abs(x[key] - y[key]) / abs(y[key]) for x, y in zip(rows, ref))


def losses(metrics_path):
    """The step records of a metrics file: those with a loss (not the validation before
    training, step 0)."""
    with open(metrics_path) as f:
        return [row for row in map(json.loads, f) if "loss" in row]



def write_shard(path, tokens):
    """An llm.c token shard: 256 int32 header (magic, version 1, count), then uint16 ids."""
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def worst_tensor_diff(got, ref):
    """The largest relative difference over the tensors of `ref`, and its tensor's name (a
    tensor missing from `got` counts as infinitely different)."""
    return max((rel_diff(got[k], ref[k]) if k in got else float("inf"), k) for k in ref)


def checkpoints_differ(a, b, rtol=None, kinds=KINDS):
    """None where checkpoint directories a and b hold the same tensors (every element, of the
    kinds given: weights, master weights, Adam's moments), bitwise or (rtol) within rtol of
    each tensor's largest magnitude; else the first difference, named
    (tests/python/checkpoint_compare.py, a reader independent of Trident's)."""
    return checkpoint_compare.compare(a, b, kinds, rtol)


def losses_match(rows, ref, keys=("loss",)):
    """Rows of two metrics files equal in count and, bitwise, in each of `keys`."""
    return len(rows) == len(ref) and all(r[k] == s[k] for r, s in zip(rows, ref) for k in keys)


def check_continued(label, got, want, tolerance=1e-5):
    """A run resumed from step 5 (`got`, {step: loss}) continues the straight run (`want`):
    steps 6 to 10, each loss within `tolerance`."""
    worst = max((abs(got[s] - want[s]) / abs(want[s]) for s in got), default=float("inf"))
    check(sorted(got) == [6, 7, 8, 9, 10] and worst <= tolerance,
          f"{label}: steps {sorted(got)} within {tolerance} of the straight run "
          f"(worst {worst:.2e})")


def binaries_or_skip():
    """The paths of trident and the gradient dump from ctest's --trident and --tools-dir;
    exits 77 (skipped, visibly) where mpirun is missing."""
    p = argparse.ArgumentParser()
    p.add_argument("--trident", required=True)
    p.add_argument("--tools-dir", required=True)
    a = p.parse_args()
    if shutil.which("mpirun") is None:
        print("SKIP: mpirun not found (Debian's openmpi-bin)")
        sys.exit(77)
    return a.trident, os.path.join(a.tools_dir, "trident_model_dump")


def plotting_run_or_skip():
    """ctest's --trident and --source-dir, for the tests that run trident under mpirun and
    plot with matplotlib; exits 77 (skipped, visibly) where either is missing."""
    p = argparse.ArgumentParser()
    p.add_argument("--trident", required=True)
    p.add_argument("--source-dir", required=True)
    a = p.parse_args()
    if shutil.which("mpirun") is None:
        print("SKIP: mpirun not found (Debian's openmpi-bin)")
        sys.exit(77)
    if subprocess.run(["/usr/bin/python3", "-c", "import matplotlib"],
                      stderr=subprocess.DEVNULL).returncode != 0:
        print("SKIP: /usr/bin/python3 has no matplotlib (Debian's python3-matplotlib)")
        sys.exit(77)
    return a


def tiny_run(directory, overrides=()):
    """Writes the layout tests' data (3000 tokens of a vocabulary of 300, which 128·M does not
    divide) and config (2 layers of hidden 32, 4 heads, sequence 16, global batch 4 in
    microbatches of 2, 10 steps, data in order) into `directory`, and returns the arguments
    that train on them, with the `--set` overrides given."""
    data = os.path.join(directory, "train.bin")
    write_shard(data, [(i * 7919 + (i * i) % 101) % 300 for i in range(3000)])
    config = os.path.join(directory, "c.yaml")
    with open(config, "w") as f:
        f.write("model: {vocab_size: 300, seq_len: 16, layers: 2, hidden: 32, heads: 4,"
                " ffn_hidden: 128}\n"
                "training: {micro_batch: 2, global_batch: 4, steps: 10, warmup_steps: 2,"
                " lr: 3.0e-3, grad_clip: 0.5, threads: 1}\n"
                f"data: {{train: {data}, shuffle: false}}\n")
    args = ["--config", config]
    for o in overrides:
        args += ["--set", o]
    return args


def trident_pids(config):
    """The trident processes started with this config (ours alone: its path is unique), by
    world rank."""
    ranks = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        except OSError:
            continue
        if args and args[0].endswith(b"trident") and config.encode() in args:
            rank = env.get(b"OMPI_COMM_WORLD_RANK")
            if rank is not None:
                ranks[int(rank)] = int(pid)
    return ranks


def start_train(trident, base, ranks, overrides, env=None):
    """`trident train` under mpirun, in the background (its output piped)."""
    cmd = ["mpirun", "--oversubscribe", "-np", str(ranks), trident, "train"] + base
    for o in overrides:
        cmd += ["--set", o]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**mpirun_env(), **(env or {})})
