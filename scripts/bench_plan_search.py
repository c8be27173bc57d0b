#!/usr/bin/python3
"""`trident plan --search` against measured runs: every layout the search lists for a config on
N ranks of this machine is timed with a short `trident bench` under mpirun (one thread a rank),
and the predicted step times are held against the measured ones: Spearman's rank correlation,
and the measured step of the search's pick against the measured best.

Usage: scripts/bench_plan_search.py --config C.yaml [--gpus 4] [--steps 5] [--warmup 2] [--repeats 2]
           [--fix key=value ...] [--set key=value ...] [--rates "--gemm-tflops 0.05 ..."]
           [--csv OUT.csv] [--mpirun CMD] [--limit K] [--trident PATH]
(build first: scripts/setup.sh). Prints a Markdown table and the two figures (docs/PERF.md,
"The search against measured runs"). --fix narrows the search as `trident plan --fix` does;
--set overrides a key the search does not vary, for the plan and every run alike;
scripts/machine_rates.sh measures --rates for N ranks of the machine;
--limit times only the first K layouts of the search's order, the pick among them. A layout's
measured step is the least of its timed steps over --repeats runs, every other pass in reverse
order.
"""
import argparse
import json
import os
import re
import shlex
import sys

from bench_pipeline import run  # a command's output; exits naming it if it fails

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRIDENT = os.path.join(ROOT, "build", "trident")
# This machine's rates as the planner takes them, for ranks of one thread each: the GEMM rate
# `trident bench` measures with two ranks a core, a memory bandwidth per rank, and MPI over
# shared memory for every link.
RATES = ("--gemm-tflops 0.05 --mem-bw 5 --intra-bw 2 --inter-bw 2 --gpus-per-node 8 "
         "--latency-us 30 --device-memory 4GiB")


def searched(args):
    """The search's layouts, fastest first: its JSON lines."""
    cmd = [args.trident, "plan", "--config", args.config, "--search", "--gpus", str(args.gpus),
           "--top", "0", "--json"] + shlex.split(args.rates)
    for f in args.fix:
        cmd += ["--fix", f]
    for s in args.set:
        cmd += ["--set", s]
    return [json.loads(line) for line in run(cmd).splitlines() if line.startswith("{")]


def measure(args, layout):
    """The shortest timed step of a short bench of the layout, seconds: on a shared machine
    other work only ever adds to a step, so the least is the layout's own time."""
    cmd = shlex.split(args.mpirun) + ["-np", str(args.gpus), args.trident, "bench", "--config",
                                      args.config, "--steps", str(args.steps), "--warmup",
                                      str(args.warmup), "--set", "training.threads=1"]
    for s in args.set + layout["set"]:
        cmd += ["--set", s]
    steps = re.findall(r"^bench step \d+ .*\| ([0-9.]+) ms \|", run(cmd), re.M)
    return min(float(ms) for ms in steps[-args.steps:]) / 1000


def ranks(values):
    """Ranks from 1, ties given their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a, b):
    """Pearson's correlation of the ranks."""
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra)
    vb = sum((y - mb) ** 2 for y in rb)
    return cov / (va * vb) ** 0.5


def grid(layout):
    """"P2 M1 C1 D2 zb-h2 mb1 zero0 sp0 none": the layout's keys, short."""
    l = layout["layout"]
    schedule = l["schedule"] + (f" v{l['virtual_stages']}" if l["virtual_stages"] > 1 else "")
    return (f"P{l['pipeline']} M{l['tensor']} C{l['context']} D{l['data']} {schedule} "
            f"mb{l['micro_batch']} zero{l['zero_stage']} sp{int(l['sequence_parallel'])} "
            f"{l['recompute']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--fix", action="append", default=[])
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--rates", default=RATES)
    ap.add_argument("--mpirun", default="mpirun --oversubscribe")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--csv")
    ap.add_argument("--trident", default=TRIDENT)
    args = ap.parse_args()
    layouts = searched(args)
    if args.limit:
        layouts = layouts[:args.limit]
    # Each pass in the other order, so that a slow spell of the machine falls on other layouts.
    passes = [[0.0] * len(layouts) for _ in range(args.repeats)]
    for r in range(args.repeats):
        order = range(len(layouts)) if r % 2 == 0 else reversed(range(len(layouts)))
        for k in order:
            step = passes[r][k] = measure(args, layouts[k])
            print(f"pass {r + 1}, {k + 1}/{len(layouts)} {grid(layouts[k])}: predicted "
                  f"{layouts[k]['step_time']['step_s'] * 1e3:.1f} ms, measured {step * 1e3:.1f} ms",
                  file=sys.stderr, flush=True)
    least = [min(p[k] for p in passes) for k in range(len(layouts))]
    rows = [(l, l["step_time"]["step_s"], m) for l, m in zip(layouts, least)]
    predicted = [r[1] for r in rows]
    measured = [r[2] for r in rows]
    best = min(measured)
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("rank,layout,predicted_s,measured_s,set\n")
            for k, (layout, p, m) in enumerate(rows):
                f.write(f"{k + 1},{grid(layout)},{p},{m},{' '.join(layout['set'])}\n")
    by_measured = ranks(measured)
    print("| search rank | layout | predicted (ms) | measured (ms) | measured rank |")
    print("| --- | --- | --- | --- | --- |")
    for k, (layout, p, m) in enumerate(rows):
        print(f"| {k + 1} | {grid(layout)} | {p * 1e3:.1f} | {m * 1e3:.1f} | "
              f"{by_measured[k]:g} |")
    print(f"\n{len(rows)} layouts; Spearman {spearman(predicted, measured):.3f}; the pick "
          f"{measured[0] * 1e3:.1f} ms against the measured best {best * 1e3:.1f} ms "
          f"({100 * (measured[0] / best - 1):.1f}% slower)")
    if len(passes) > 1 and len(rows) > 1:
        # How well the machine measures: the first two passes' rank correlation.
        print(f"the first two passes against each other: Spearman "
              f"{spearman(passes[0], passes[1]):.3f}")


if __name__ == "__main__":
    main()
