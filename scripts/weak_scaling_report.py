#!/usr/bin/python3
"""The table and the plot of scripts/weak_scaling.sh: reads its results (one `trident bench`
JSON line per size, with the size's and the paper's figures added), writes a CSV, prints a
Markdown table, and draws a PNG: weak-scaling efficiency against the ideal (100%) and the
paper's, and the aggregate TFLOP/s against linear scaling.

Efficiency at M = per-rank TFLOP/s at M / per-rank TFLOP/s at the smallest M run, as in the
paper's Figure 5 (where the baseline is one V100's 39 TFLOP/s). Beside it: the GEMM rate each
rank measured at start-up and the MFU against it, which show how much of the cores the ranks
had (on a shared or oversubscribed machine, less than all).

Usage: scripts/weak_scaling_report.py RESULTS.jsonl --csv OUT.csv [--png OUT.png]
"""
import argparse
import csv
import json
import sys

COLUMNS = ["ranks", "tensor", "data", "hidden", "heads", "layers", "parameters",
           "params_per_rank", "tokens_per_s", "tflops_per_rank", "gemm_peak_tflops_per_rank", "mfu",
           "step_ms",
           "efficiency_pct", "paper_hidden", "paper_layers", "paper_params_billion",
           "paper_efficiency_pct", "family", "cores"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results")
    parser.add_argument("--csv", required=True)
    parser.add_argument("--png")
    a = parser.parse_args()
    with open(a.results) as f:
        points = sorted((json.loads(line) for line in f if line.strip()), key=lambda p: p["tensor"])
    if not points:
        raise SystemExit(f"weak_scaling_report: {a.results} has no results")
    base = points[0]["tflops"]
    rows = []
    for p in points:
        rows.append({
            "ranks": p["processes"], "tensor": p["tensor"], "data": p["data"],
            "hidden": p["hidden"], "heads": p["heads"], "layers": p["layers"],
            "parameters": p["parameters"], "params_per_rank": p["parameters"] // p["tensor"],
            "tokens_per_s": round(p["tokens_per_s"], 1), "tflops_per_rank": round(p["tflops"], 5),
            "gemm_peak_tflops_per_rank": round(p["peak_tflops"], 5),
            "mfu": round(p["mfu"], 4), "step_ms": round(p["step_ms"], 1),
            "efficiency_pct": round(100.0 * p["tflops"] / base, 1),
            "paper_hidden": p["paper_hidden"], "paper_layers": p["paper_layers"],
            "paper_params_billion": p["paper_params_billion"],
            "paper_efficiency_pct": p["paper_efficiency_pct"], "family": p["family"],
            "cores": p["cores"]})
    with open(a.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    print(f"weak_scaling_report: wrote {a.csv}")

    print("| M | ranks | hidden | heads | layers | parameters per rank | tokens/s "
          "| TFLOP/s per rank | GEMM TFLOP/s per rank | MFU | efficiency | paper's efficiency |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['tensor']} | {r['ranks']} | {r['hidden']} | {r['heads']} | {r['layers']} "
              f"| {r['params_per_rank'] / 1e6:.2f} M | {r['tokens_per_s']:.0f} "
              f"| {r['tflops_per_rank']:.4f} | {r['gemm_peak_tflops_per_rank']:.4f} "
              f"| {100 * r['mfu']:.1f}% | {r['efficiency_pct']:.1f}% | {r['paper_efficiency_pct']}% |")

    if a.png:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("weak_scaling_report: matplotlib is missing (Debian's python3-matplotlib):"
                  " no plot", file=sys.stderr)
            return 1
        m = [r["tensor"] for r in rows]
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5), dpi=100)
        left.plot(m, [100] * len(m), "k--", label="ideal")
        left.plot(m, [r["paper_efficiency_pct"] for r in rows], "s:", color="0.5",
                  label="Megatron-LM 2019 (V100, Fig. 5)")
        left.plot(m, [r["efficiency_pct"] for r in rows], "o-", label=f"Trident ({rows[0]['family']})")
        left.set_xscale("log", base=2)
        left.set_xticks(m, [str(x) for x in m])
        left.set_ylim(0, 110)
        left.set_xlabel("tensor-parallel ranks M (model grows with M)")
        left.set_ylabel("weak-scaling efficiency (%)")
        left.grid(True, alpha=0.3)
        ranks = [r["ranks"] for r in rows]
        total = [r["tflops_per_rank"] * r["ranks"] for r in rows]
        right.plot(ranks, [rows[0]["tflops_per_rank"] * n / rows[0]["ranks"] for n in ranks], "k--",
                   label="linear")
        right.plot(ranks, total, "o-", label="measured")
        cores = rows[0]["cores"]
        if max(ranks) > cores:  # past here ranks share cores: the machine's limit, not the code's
            for axis in (left, right):
                axis.axvline(cores, color="tab:red", alpha=0.4, linewidth=1,
                             label=f"ranks = cores ({cores})")
        right.set_xscale("log", base=2)
        right.set_xticks(ranks, [str(x) for x in ranks])
        right.set_xlabel("ranks")
        right.set_ylabel("aggregate TFLOP/s")
        right.grid(True, alpha=0.3)
        left.legend(loc="lower left")
        right.legend(loc="upper left")
        fig.suptitle(f"Weak scaling, {rows[0]['family']} family, {rows[0]['cores']} cores here")
        fig.tight_layout()
        fig.savefig(a.png)
        print(f"weak_scaling_report: wrote {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
