#!/usr/bin/env python3
"""Per-kernel GPU time from Nsight Compute's CSV (scripts/gpu_verify.sh's profile phases).

  kernel_times.py CSV [TOP]

CSV is `ncu --metrics gpu__time_duration.sum --csv --print-units base` output: one row per
kernel launch. Prints the TOP (default 25) kernels by total time, each with its launches, its
total and mean time and its share of all kernel time, and the total last.
"""
import csv
import sys
from collections import defaultdict


def main(path, top=25):
    with open(path, errors="replace") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's own messages are unquoted
    total, count = defaultdict(float), defaultdict(int)
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        ns = float(row["Metric Value"].replace(",", ""))
        total[row["Kernel Name"]] += ns
        count[row["Kernel Name"]] += 1
    whole = sum(total.values())
    if not whole:
        print("no kernel times in", path)
        return 1
    print(f"{'share':>6} {'total ms':>9} {'launches':>8} {'mean us':>8}  kernel")
    for name, ns in sorted(total.items(), key=lambda kv: -kv[1])[:int(top)]:
        print(f"{100 * ns / whole:5.1f}% {ns / 1e6:9.2f} {count[name]:8d} "
              f"{ns / count[name] / 1e3:8.1f}  {name[:110]}")
    print(f"all kernels: {whole / 1e6:.2f} ms in {sum(count.values())} launches")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
