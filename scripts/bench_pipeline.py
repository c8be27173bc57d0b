#!/usr/bin/python3
"""Pipeline schedules side by side on the CPU benchmark model: step time, the most memory a
rank holds, the bubble measured in the Chrome trace of the timed steps, and the bubble the
simulator predicts for the same schedule with the forward, B and W costs that trace measured.

Usage: scripts/bench_pipeline.py [--pipelines 2,4] [--schedules 1f1b,zb-h1,zb-h2]
                                 [--steps 3] [--microbatches 8] [--mpirun CMD]
(build first: scripts/setup.sh). Prints a Markdown table (docs/PERF.md keeps one).

The measured bubble of a step is, as the simulator counts it, (time - ideal) / ideal: time
from the first rank's first compute to the last rank's last, ideal the busiest rank's compute
(forwards, backwards, B's and W's). Each process runs one thread.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRIDENT = os.path.join(ROOT, "build", "trident")
COMPUTE = {"forward", "backward", "backward_input", "backward_weight"}


def run(cmd):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stdout}{p.stderr}")
    return p.stdout


def measured(trace_path, steps):
    """The mean bubble of the traced steps, and the mean forward, B and W (or backward) time."""
    with open(trace_path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e["ph"] == "X"]
    ends = sorted(e["ts"] + e["dur"] for e in events if e["name"] == "optimizer")
    bubbles, durations = [], {}
    step_start = min(e["ts"] for e in events)
    for k in range(steps):
        # The step's compute: what ran before the end of its update, after the previous one.
        step_end = ends[(k + 1) * len(ends) // steps - 1]
        spans = [e for e in events if e["name"] in COMPUTE and step_start <= e["ts"] < step_end]
        busy = {}
        for e in spans:
            busy[e["pid"]] = busy.get(e["pid"], 0.0) + e["dur"]
            durations.setdefault(e["name"], []).append(e["dur"])
        first = min(e["ts"] for e in spans)
        last = max(e["ts"] + e["dur"] for e in spans)
        ideal = max(busy.values())
        bubbles.append((last - first - ideal) / ideal)
        step_start = step_end
    mean = {name: sum(d) / len(d) for name, d in durations.items()}
    return sum(bubbles) / len(bubbles), mean


def simulated(schedule, pipeline, microbatches, costs):
    forward = costs["forward"]
    if "backward" in costs:
        backward, weight = costs["backward"], costs["backward"] / 2
    else:
        backward = costs["backward_input"] + costs["backward_weight"]
        weight = costs["backward_weight"]
    out = run([TRIDENT, "schedule", "--kind", schedule, "--pipeline", str(pipeline),
               "--microbatches", str(microbatches), "--svg", "",
               "--forward-cost", f"{forward:.6g}", "--backward-cost", f"{backward:.6g}",
               "--weight-cost", f"{weight:.6g}"])
    return float(re.search(r"bubble fraction: ([0-9.]+) measured", out).group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipelines", default="2,4")
    parser.add_argument("--schedules", default="1f1b,zb-h1,zb-h2")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--mpirun", default="mpirun --oversubscribe")
    args = parser.parse_args()
    print("| P | schedule | tokens/s | step ms | peak memory MiB | bubble measured | "
          "bubble simulated (measured costs) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for pipeline in (int(p) for p in args.pipelines.split(",")):
            for schedule in args.schedules.split(","):
                trace = os.path.join(tmp, f"{schedule}-{pipeline}.json")
                out = run(args.mpirun.split() + ["-np", str(pipeline), TRIDENT, "bench",
                          "--config", os.path.join(ROOT, "configs", "bench-cpu.yaml"),
                          "--steps", str(args.steps),
                          "--set", "training.threads=1", "--set", "training.micro_batch=2",
                          "--set", f"training.global_batch={2 * args.microbatches}",
                          "--set", f"parallel.pipeline={pipeline}",
                          "--set", f"parallel.schedule={schedule}",
                          "--set", f"logging.trace={trace}"])
                result = json.loads(out.strip().splitlines()[-1])
                bubble, costs = measured(trace, args.steps)
                predicted = simulated(schedule, pipeline, args.microbatches, costs)
                print(f"| {pipeline} | {schedule} | {result['tokens_per_s']:.0f} | "
                      f"{result['step_ms']:.0f} | {result['peak_memory_bytes'] / 2**20:.1f} | "
                      f"{bubble:.3f} | {predicted:.3f} |", flush=True)


if __name__ == "__main__":
    main()
