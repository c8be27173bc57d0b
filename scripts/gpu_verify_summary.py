#!/usr/bin/env python3
"""summary.json of scripts/gpu_verify.sh, rewritten after every phase.

  gpu_verify_summary.py RECORDS LOGS STATUS ELAPSED_S

RECORDS holds facts.tsv (key, value) and phases.tsv (name, outcome, seconds), as the script
appends them; LOGS the phases' logs (<phase>.log). From each log it takes the figures the GPU
tests print:
  "compared: WHAT: relative error E (at most L)"   every GPU tensor against the CPU's
  "losses: N steps, worst relative difference D (at most L)"   training against the CPU
  "SKIPPED: ..."                                    what a test could not do on this machine
  Catch2's "--durations yes" lines ("S s: NAME")   each test case's time
and keeps, per phase, the worst error of each compared tensor (each WHAT names the op, the
tensor and the element type), the worst loss difference for each tolerance L,
the named skips and the test cases' times; the benchmark's rows come from bench_gpu.jsonl.
"""
import json
import os
import re
import sys

COMPARED = re.compile(r"^compared: (.*): relative error (\S+) \(at most (\S+)\)")
LOSSES = re.compile(r"^losses: (\d+) steps, worst relative difference (\S+) \(at most (\S+)\)")
DURATION = re.compile(r"^(\d+\.\d+) s: (.+)$")


def read_tsv(path):
    if not os.path.exists(path):
        return []
    with open(path, errors="replace") as f:
        return [line.rstrip("\n").split("\t") for line in f if line.strip()]


def figures(log):
    """The worst errors, loss differences, skips and case times of one phase's log."""
    worst, losses, skips, cases = {}, {}, [], {}
    with open(log, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = COMPARED.match(line)
            if m:
                key = m.group(1)
                error, limit = float(m.group(2)), float(m.group(3))
                if key not in worst or not error <= worst[key]["error"]:
                    worst[key] = {"error": error, "limit": limit}
                continue
            m = LOSSES.match(line)
            if m:  # the worst for each tolerance (fp32's and 16-bit's apart)
                diff, limit = float(m.group(2)), m.group(3)
                if limit not in losses or not diff <= losses[limit]["worst"]:
                    losses[limit] = {"worst": diff, "steps": int(m.group(1))}
                continue
            if "SKIPPED: " in line:
                skips.append(line[line.index("SKIPPED: "):])
            m = DURATION.match(line)
            if m:
                cases[m.group(2)] = float(m.group(1))
    out = {}
    if worst:
        out["worst_errors"] = worst
    if losses:
        out["losses"] = losses
    if skips:
        out["named_skips"] = sorted(set(skips))
    if cases:
        out["case_seconds"] = cases
    return out


def main(records, logs, status, elapsed):
    summary = {"status": status, "elapsed_s": int(elapsed),
               "found": dict(r[:2] for r in read_tsv(os.path.join(records, "facts.tsv"))
                             if len(r) >= 2),
               "phases": []}
    for row in read_tsv(os.path.join(records, "phases.tsv")):
        name, outcome, seconds = row[0], row[1], int(row[2])
        phase = {"name": name, "outcome": outcome, "seconds": seconds}
        log = os.path.join(logs, name + ".log")
        if os.path.exists(log):
            phase.update(figures(log))
        summary["phases"].append(phase)
    bench = os.path.join(logs, "bench_gpu.jsonl")
    if os.path.exists(bench):
        with open(bench) as f:
            summary["bench"] = [json.loads(line) for line in f if line.strip()]
    json.dump(summary, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main(*sys.argv[1:5])
