#!/usr/bin/env python3
"""The rows and the table of scripts/bench_gpu.sh.

  bench_gpu_row.py MODEL TRAINER LOG EXIT BASE_MIB WARMUP BATCH SEQ
      one run's row (a JSON line) from its log and the memory samples beside it (LOG.memory):
      tokens/s, step time, peak memory over the baseline, and the trainer's own peak
  bench_gpu_row.py --merge KEPT NEW
      every row of KEPT (an earlier call's bench_gpu.jsonl; absent: none) not measured again in
      NEW, then NEW's rows
  bench_gpu_row.py --table ROWS PEAK_TFLOPS SEQ
      the markdown table: tokens/s, model TFLOP/s (Megatron's model FLOPs, docs/FORMULAS.md),
      MFU against PEAK_TFLOPS, peak memory; exits 1 if a row has no figure
"""
import json
import os
import re
import statistics
import sys

SHAPES = {"124m": (12, 768), "350m": (24, 1024), "1.5b": (48, 1600)}
VOCAB = 50257


def row(model, trainer, log, status, base, warmup, batch, seq):
    text = open(log, errors="replace").read()
    r = {"model": model, "trainer": trainer, "exit": int(status)}
    try:
        used = [int(x) for x in open(log + ".memory").read().split() if x.isdigit()]
        r["peak_memory_mib"] = max(used) - int(base) if used else None
    except OSError:
        r["peak_memory_mib"] = None
    if trainer == "llmc":  # "step   4/13 | loss ... | 123.45 ms | ..." per step
        ms = [float(m) for m in re.findall(r"^step +\d+/\d+ \|.*?\| ([0-9.]+) ms \|", text, re.M)]
        timed = ms[int(warmup):]
        if timed:
            r["step_ms"] = statistics.median(timed)
            r["tokens_per_s"] = int(batch) * int(seq) / (r["step_ms"] / 1e3)
    else:  # the last JSON line with tokens_per_s
        for line in reversed(text.splitlines()):
            if line.startswith("{") and "tokens_per_s" in line:
                own = json.loads(line)
                r["tokens_per_s"] = own["tokens_per_s"]
                r["step_ms"] = own.get("step_ms")
                r["own_peak_memory_bytes"] = own.get("peak_memory_bytes")
                break
    if "tokens_per_s" not in r:
        r["error"] = "no figure (exit %s): see %s in bench_logs.tar.gz" % (
            status, os.path.basename(log))
    return r


def read_rows(path):
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path) if line.strip()]


def merge(kept, new):
    fresh = read_rows(new)
    measured = {(r["model"], r["trainer"]) for r in fresh}
    return [r for r in read_rows(kept) if (r["model"], r["trainer"]) not in measured] + fresh


def table(rows, peak, seq):
    lines = ["| model | trainer | tokens/s | model TFLOP/s | MFU | peak memory (MiB) |",
             "| --- | --- | --- | --- | --- | --- |"]
    failed = 0
    for r in sorted(rows, key=lambda r: (list(SHAPES).index(r["model"]), r["trainer"])):
        if "tokens_per_s" not in r:
            failed += 1
            lines.append(f"| {r['model']} | {r['trainer']} | — | — | — | {r.get('error', '')} |")
            continue
        L, h = SHAPES[r["model"]]
        per_token = 72 * L * h * h * (1 + seq / (12 * h) + VOCAB / (12 * L * h))
        tflops = r["tokens_per_s"] * per_token / 1e12
        memory = r.get("peak_memory_mib")
        lines.append(f"| {r['model']} | {r['trainer']} | {r['tokens_per_s']:.0f} | {tflops:.1f} | "
                     f"{100 * tflops / peak:.1f}% | {memory if memory is not None else '—'} |")
    return "\n".join(lines), failed


def main(argv):
    if argv[0] == "--merge":
        for r in merge(argv[1], argv[2]):
            print(json.dumps(r))
        return 0
    if argv[0] == "--table":
        text, failed = table(read_rows(argv[1]), float(argv[2]), int(argv[3]))
        print(text)
        return 1 if failed else 0
    print(json.dumps(row(*argv[:8])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
