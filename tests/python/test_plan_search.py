"""`trident plan --search` lists every layout that keeps the rules, each once: for small models
on 1 to 8 GPUs, the layouts it lists (with a device memory that every one fits) are the set this
file enumerates from the rules as docs/FEATURES.md ("Searching for a layout") states them,
written here without the planner's code; --fix keeps the subset with the held value, and a GPU
count no layout reaches is one line and a non-zero exit.

Standard library only; the usual --trident and --tools-dir arguments.
"""
import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile

GPT2 = {"arch": "gpt2", "seq_len": 16, "layers": 4, "heads": 4, "kv_heads": 4, "ffn_hidden": 128,
        "global_batch": 8, "eval_sequences": 32}
LLAMA = {"arch": "llama", "seq_len": 16, "layers": 6, "heads": 8, "kv_heads": 2, "ffn_hidden": 96,
         "global_batch": 12, "eval_sequences": 24}
RATES = ["--gemm-tflops", "100", "--mem-bw", "1000", "--intra-bw", "100", "--inter-bw", "10",
         "--device-memory", "1TiB"]


def yaml_of(m):
    kv = f", kv_heads: {m['kv_heads']}" if m["arch"] == "llama" else ""
    return (f"model: {{arch: {m['arch']}, vocab_size: 64, seq_len: {m['seq_len']}, layers: "
            f"{m['layers']}, hidden: 32, heads: {m['heads']}{kv}, ffn_hidden: {m['ffn_hidden']}}}\n"
            f"training: {{micro_batch: 1, global_batch: {m['global_batch']}, eval_sequences: "
            f"{m['eval_sequences']}}}\n")


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def grids(m, n, per_node):
    """(P, M, C, D) of n GPUs: the tensor group divides the heads, the FFN and the node (and, in
    a llama, is a divisor or a multiple of the key/value heads); 2C divides the sequence; P is
    at most the layers; D divides the global batch and the validation sequences."""
    for P, M, C in itertools.product(divisors(n), repeat=3):
        if n % (P * M * C):
            continue
        D = n // (P * M * C)
        if m["heads"] % M or m["ffn_hidden"] % M or per_node % M:
            continue
        if m["arch"] == "llama" and m["kv_heads"] % M and M % m["kv_heads"]:
            continue
        if C > 1 and m["seq_len"] % (2 * C):
            continue
        if P > m["layers"] or m["global_batch"] % D or m["eval_sequences"] % D:
            continue
        yield P, M, C, D


def schedules(P, layers, microbatches):
    """(schedule, v): one stage runs 1f1b; interleaved takes every v from 2 with P·v layers at
    most and P dividing the microbatches; zb-v has two chunks a stage."""
    if P == 1:
        return [("1f1b", 1)]
    out = [("1f1b", 1), ("zb-h1", 1), ("zb-h2", 1)]
    if microbatches % P == 0:
        out += [("interleaved", v) for v in range(2, layers // P + 1)]
    if 2 * P <= layers:
        out.append(("zb-v", 2))
    return out


def shardings(dc):
    """(ZeRO stage, shard ranks): stage 0 alone with one rank of D·C; else every stage over all
    D·C ranks, and stages 1-3 over each divisor of D·C from 2 below it."""
    if dc == 1:
        return [(0, 1)]
    return [(z, dc) for z in range(4)] + [(z, s) for z in (1, 2, 3) for s in divisors(dc)
                                          if 2 <= s < dc]


def expected(m, n, per_node):
    out = set()
    for P, M, C, D in grids(m, n, per_node):
        for b in divisors(m["global_batch"] // D):
            if m["eval_sequences"] % (b * D):
                continue
            rows = b * m["seq_len"] // C
            tensor = [(False, False)]
            if M > 1 and rows % M == 0:
                tensor += [(True, False), (True, True)]
            for (kind, v), recompute, (sp, overlap), (zero, shard) in itertools.product(
                    schedules(P, m["layers"], m["global_batch"] // (b * D)),
                    ("none", "selective", "full"), tensor, shardings(D * C)):
                out.add((P, M, C, D, kind, v, b, zero, shard, sp, overlap, recompute))
    return out


def listed(trident, config, n, per_node, fixes):
    cmd = [trident, "plan", "--config", config, "--search", "--gpus", str(n), "--top", "0",
           "--json", "--gpus-per-node", str(per_node)] + RATES
    for f in fixes:
        cmd += ["--fix", f]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return None, p.stderr
    out = []
    for line in p.stdout.splitlines():
        l = json.loads(line)["layout"]
        out.append((l["pipeline"], l["tensor"], l["context"], l["data"], l["schedule"],
                    l["virtual_stages"], l["micro_batch"], l["zero_stage"], l["data_shard"],
                    l["sequence_parallel"], l["tp_overlap"], l["recompute"]))
    return out, p.stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trident", required=True)
    ap.add_argument("--tools-dir")
    args = ap.parse_args()
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = [(GPT2, n, 4, []) for n in range(1, 9)] + [(LLAMA, n, 8, []) for n in (4, 6, 8)]
        # Held keys: the rules' layouts with those values (P = 2, zb-v's v = 2).
        cases += [(GPT2, 8, 4, ["parallel.pipeline=2", "parallel.schedule=zb-v"])]
        for m, n, per_node, fixes in cases:
            config = os.path.join(tmp, m["arch"] + ".yaml")
            with open(config, "w") as f:
                f.write(yaml_of(m))
            want = expected(m, n, per_node)
            if fixes:
                want = {l for l in want if l[0] == 2 and l[4] == "zb-v"}
            got, err = listed(args.trident, config, n, per_node, fixes)
            name = f"{m['arch']} on {n} GPUs ({per_node} a node) {' '.join(fixes)}"
            if not want:
                lines = err.strip().splitlines()
                if got is not None or len(lines) != 1 or "no layout of" not in lines[0]:
                    failures.append(f"{name}: no layout keeps the rules, yet: {err!r}")
                continue
            if got is None:
                failures.append(f"{name}: failed: {err}")
                continue
            if len(got) != len(set(got)):
                failures.append(f"{name}: {len(got) - len(set(got))} layouts listed twice")
            missing, extra = want - set(got), set(got) - want
            if missing or extra:
                failures.append(f"{name}: {len(missing)} missing (e.g. {sorted(missing)[:2]}), "
                                f"{len(extra)} not expected (e.g. {sorted(extra)[:2]})")
            print(f"{name}: {len(got)} layouts, {len(want)} expected")
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
