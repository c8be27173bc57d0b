#!/usr/bin/python3
"""The matrix optimizers against AdamW on the default job's model (configs/default.yaml): the
median training step of each (`trident bench`), the optimizer's time per step in the Chrome
trace of the timed steps on one process and with the matrices shared out by owner ranks at
D = 2 (ZeRO-1) and M = 2, and, with --validation, each one's validation loss after the default
job's 300 steps of the King James Bible (scripts/run.sh makes the data).

Usage: scripts/bench_optimizers.py [--optimizers adamw,muon,galore] [--steps 6]
                                   [--validation] [--mpirun CMD]
(build first: scripts/setup.sh). Prints Markdown tables (docs/PERF.md keeps them).

The step times use every core in one process. The optimizer times run one thread per process,
so D = 2 and M = 2 have the cores of two processes where one process has one: the figure asked
of a distributed matrix optimizer is its time per step on a rank against one process's.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRIDENT = os.path.join(ROOT, "build", "trident")
CONFIG = os.path.join(ROOT, "configs", "default.yaml")
LAYOUTS = {  # name: (processes, --set overrides)
    "1 process": (1, []),
    "D = 2, ZeRO-1": (2, ["parallel.data=2", "parallel.zero_stage=1"]),
    "M = 2": (2, ["parallel.tensor=2"]),
}


def run(cmd):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stdout}{p.stderr}")
    return p.stdout


def sets(overrides):
    return [a for o in overrides for a in ("--set", o)]


def bench(optimizer, steps, overrides, processes=1, mpirun=None):
    """The bench's JSON line."""
    cmd = [TRIDENT, "bench", "--config", CONFIG, "--steps", str(steps), "--warmup", "1"]
    cmd += sets([f"optimizer.name={optimizer}"] + overrides)
    if processes > 1:
        cmd = mpirun.split() + ["-np", str(processes)] + cmd
    return json.loads(run(cmd).strip().splitlines()[-1])


def optimizer_ms(optimizer, steps, layout, mpirun):
    """The mean optimizer span of the timed steps, the slowest traced rank's."""
    processes, overrides = LAYOUTS[layout]
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.json")
        bench(optimizer, steps, overrides + ["training.threads=1", "training.micro_batch=8",
                                             f"logging.trace={trace}"], processes, mpirun)
        with open(trace) as f:
            spans = [e for e in json.load(f)["traceEvents"]
                     if e["ph"] == "X" and e["name"] == "optimizer"]
    per_rank = {}
    for e in spans:
        per_rank.setdefault(e["pid"], []).append(e["dur"] / 1e3)
    return max(statistics.mean(d) for d in per_rank.values())


def validation(optimizer):
    """The default job's validation losses (steps 100, 200, 300) and last step time."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "metrics.jsonl")
        run([TRIDENT, "train", "--config", CONFIG] +
            sets([f"optimizer.name={optimizer}", f"checkpoint.dir={tmp}/run",
                  f"logging.metrics={metrics}", "logging.sample_tokens=0"]))
        with open(metrics) as f:
            lines = [json.loads(line) for line in f]
    return [m["val_loss"] for m in lines if "val_loss" in m]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--optimizers", default="adamw,muon,galore")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--validation", action="store_true")
    ap.add_argument("--mpirun", default="mpirun --oversubscribe")
    args = ap.parse_args()
    names = args.optimizers.split(",")

    print("| optimizer | step (ms) | against AdamW |")
    print("| --- | --- | --- |")
    steps = {o: bench(o, args.steps, [])["step_ms"] for o in names}
    for o in names:
        ratio = f"{steps[o] / steps['adamw']:.2f}x" if "adamw" in steps else "-"
        print(f"| {o} | {steps[o]:.0f} | {ratio} |")

    print("\n| optimizer | layout | optimizer time per step (ms) | against 1 process |")
    print("| --- | --- | --- | --- |")
    for o in names:
        alone = optimizer_ms(o, args.steps, "1 process", args.mpirun)
        print(f"| {o} | 1 process | {alone:.1f} | 1.00 |")
        for layout in list(LAYOUTS)[1:]:
            ms = optimizer_ms(o, args.steps, layout, args.mpirun)
            print(f"| {o} | {layout} | {ms:.1f} | {ms / alone:.2f} |")

    if args.validation:
        print("\n| optimizer | validation loss at steps 0 / 100 / 200 / 300 |")
        print("| --- | --- |")
        for o in names:
            print(f"| {o} | {' / '.join(f'{v:.3f}' for v in validation(o))} |")


if __name__ == "__main__":
    main()
