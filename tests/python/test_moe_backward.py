#!/usr/bin/python3
"""The order of a mixture of experts' backward (model/moe_mlp.cpp, model/gpt.cpp), against one
process and against itself:

1. recompute (full and selective) on a model of both kinds of layer (a dense first layer, then
   MoE: DeepSeek's first_k_dense_replace), each rebuilt into the one recompute scratch laid
   out by its own kind (model/activation_store.h), on one process, at E = 2 D = 2, at M = 2
   + SP and at E = 2 D = 2 M = 2 + SP: 10 steps' losses, moe_aux_loss, moe_z_loss and loads
   within 1e-5 of one process without recompute;
2. parallel.ep_overlap (each attention's weight gradients under the backward dispatch of the
   MoE layer below it) on a 4-layer model: 10 steps at E = 2 with ZeRO 0 to 3, M + SP with
   selective recompute, P (1F1B) and C (ring) within 1e-5 of one process's, and each equal,
   loss for loss and gradient norm for gradient norm, to the same layout's without it, and
   its checkpoint of step 10 (weights, fp32 masters, AdamW moments) to that layout's, element
   by element (checkpoint_compare.py); in the
   trace of E = 2 D = 2, 3 spans of ep_attention, each between a backward dispatch's issue
   and the next exchange's, after that dispatch's shared experts and before its combine's
   weight gradients.

Exit 77 (skipped) without torch and numpy or mpirun.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

try:
    import torch
except ImportError as e:
    print(f"SKIP: the PyTorch reference needs torch and numpy ({e})")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint_compare  # noqa: E402
import moe_reference as ref  # noqa: E402
from layout_families import check_families  # noqa: E402
from mpi_harness import check, failures, losses, run, tiny_run  # noqa: E402
from test_moe import LAYOUT_MOE, test_layouts  # noqa: E402

# Recompute on layers of two kinds: each rebuilds into the one recompute scratch laid out as its
# own kind's buffers (model/activation_store.h), the dense first layer's and the MoE layer's.
MIXED_MOE = ref.Moe(experts=4, top_k=2, ffn=32, shared=1, aux_loss=0.05, z_loss=0.01,
                    first_dense=1)
MIXED_FAMILIES = [
    ("recompute full", 1, ["training.recompute=full"]),
    ("recompute selective", 1, ["training.recompute=selective"]),
    ("recompute full, E=2 D=2", 2, ["parallel.data=2", "parallel.expert=2",
                                    "training.recompute=full"]),
    ("recompute full, M=2 +SP", 2, ["parallel.tensor=2", "parallel.sequence_parallel=true",
                                    "training.recompute=full"]),
    ("recompute selective, E=2 D=2 M=2 +SP", 4, ["parallel.data=2", "parallel.expert=2",
                                                 "parallel.tensor=2",
                                                 "parallel.sequence_parallel=true",
                                                 "training.recompute=selective"]),
]

# parallel.ep_overlap's layouts (on 4 layers: every stage holds a layer above an MoE layer).
OVERLAP_FAMILIES = [
    ("E=2 D=2 ZeRO-0", 2, ["parallel.data=2", "parallel.expert=2", "parallel.zero_stage=0"]),
    ("E=2 D=2 ZeRO-1", 2, ["parallel.data=2", "parallel.expert=2", "parallel.zero_stage=1"]),
    ("E=2 D=2 ZeRO-2", 2, ["parallel.data=2", "parallel.expert=2", "parallel.zero_stage=2"]),
    ("E=2 D=2 ZeRO-3", 2, ["parallel.data=2", "parallel.expert=2", "parallel.zero_stage=3"]),
    ("E=2 D=2 M=2 +SP selective", 4, ["parallel.data=2", "parallel.expert=2",
                                      "parallel.tensor=2", "parallel.sequence_parallel=true",
                                      "training.recompute=selective"]),
    ("E=2 D=2 P=2 1f1b", 4, ["parallel.data=2", "parallel.expert=2", "parallel.pipeline=2",
                            "parallel.stage_layers=uniform"]),
    ("E=2 C=2 ring", 2, ["parallel.context=2", "parallel.expert=2"]),
]


def test_ep_overlap(tmp, trident):
    directory = os.path.join(tmp, "ep_overlap")
    os.makedirs(directory, exist_ok=True)
    base = tiny_run(directory, ["model.arch=llama", "checkpoint.dir=null", "model.layers=4"]
                    + LAYOUT_MOE.overrides())
    # Each run writes its checkpoint of step 10.
    def saved(i, kind):
        return [f"checkpoint.dir={directory}/ck_{kind}_{i}", "checkpoint.interval=10"]
    overlapped = [(n, r, o + ["parallel.ep_overlap=true"] + saved(i, "with"))
                  for i, (n, r, o) in enumerate(OVERLAP_FAMILIES)]
    check_families(trident, base, directory, "ep_overlap", families=overlapped)
    # The same computations in another order: each layout's own run without it, to the bit.
    for i, (name, ranks, overrides) in enumerate(OVERLAP_FAMILIES):
        with_it = [(r["loss"], r["grad_norm"]) for r in losses(
            os.path.join(directory, f"families_{i}.jsonl")) if "loss" in r]
        metrics = os.path.join(directory, f"without_{i}.jsonl")
        run([trident, "train"] + base + [a for o in overrides + saved(i, "without") + [
            f"logging.metrics={metrics}"] for a in ("--set", o)], ranks=ranks)
        without = [(r["loss"], r["grad_norm"]) for r in losses(metrics) if "loss" in r]
        check(len(with_it) == 10 and with_it == without,
              f"ep_overlap, {name}: 10 steps' losses and gradient norms equal those without it")
        differs = checkpoint_compare.compare(f"{directory}/ck_with_{i}/step_000010",
                                             f"{directory}/ck_without_{i}/step_000010")
        check(differs is None, f"ep_overlap, {name}: step 10's weights, fp32 masters and AdamW "
                               f"moments equal those without it, element by element ({differs})")
    check_attention_under_dispatch(directory, trident, base)


def check_attention_under_dispatch(directory, trident, base):
    """In the trace of E = 2 D = 2 (rank 0, one microbatch), the attention weight gradients of
    layers 3, 2 and 1 (ep_attention) each run while a backward dispatch is under way: after its
    shared experts', which follow its issue, and before the next exchange is issued (the
    combine, after the dispatch is waited for and the experts' backward)."""
    trace = os.path.join(directory, "trace.json")
    run([trident, "train"] + base + [a for o in (
        "parallel.data=2", "parallel.expert=2", "parallel.ep_overlap=true",
        f"logging.trace={trace}", "logging.trace_from=2", "logging.trace_steps=1")
        for a in ("--set", o)], ranks=2)
    with open(trace) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    attention = [e for e in events if e["name"] == "ep_attention"]
    issued = sorted(e["args"]["issued"] for e in events if e["name"] == "ep_exchange")
    under = [a for a in attention if any(
        i <= a["ts"] and a["ts"] + a["dur"] <= j for i, j in zip(issued, issued[1:]))]
    names = [e["name"] for e in sorted(events, key=lambda e: e["ts"])
             if e["name"] in ("ep_shared", "ep_attention", "ep_wgrad")]
    # The forward's 4 dispatches, then the backward's: layer 3's, then layers 2 to 0's, each
    # with the attention above it.
    want = ["ep_shared"] * 5 + ["ep_wgrad"] + ["ep_shared", "ep_attention", "ep_wgrad"] * 3
    check(len(attention) == 3 and len(under) == 3 and names == want,
          f"ep_overlap trace: {len(under)} of {len(attention)} ep_attention spans between a "
          f"dispatch's issue and the next exchange's, in the order {names}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trident", required=True)
    parser.add_argument("--tools-dir", required=True)
    parser.add_argument("--keep", metavar="DIR")
    args = parser.parse_args()
    if shutil.which("mpirun") is None:
        print("SKIP: mpirun not found (Debian's openmpi-bin)")
        return 77
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.keep or scratch
        os.makedirs(tmp, exist_ok=True)
        test_layouts(tmp, args.trident, MIXED_FAMILIES, "moe, dense and MoE layers", MIXED_MOE)
        test_ep_overlap(tmp, args.trident)
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
