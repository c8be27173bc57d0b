#!/usr/bin/python3
"""Muon and GaLore with the experts split over E (parallel.expert; optim/matrix_exchange.h):
each expert's matrices put together, stepped and split back over the ranks of a shard group
that hold that expert (its expert-shard group and the tensor group), the rest's over the shard
group as without experts.

1. 10 steps of a llama with a mixture of experts (4 experts, top-2, a shared expert) on the
   expert-parallel families (E = 2 over D = 2 at ZeRO 0 to 3; E = 2 over D = 4, whose
   expert-data groups of 2 sum each expert's slices; E = 4 over D = 4; E = 2 with M = 2 and
   sequence parallelism; E = 2 with P = 2; hybrid sharding, E = 2 over D = 4 with data_shard 2
   at ZeRO-1 and over C = 2, D = 4 with data_shard 4 at ZeRO-3, whose expert-shard groups of 2
   sum each expert's slices) within 1e-5 of one process, for Muon and for GaLore
   (rank 4, its projector renewed every 4 steps, so twice within the run);
2. a checkpoint written at step 5 with the experts split (E = 2, D = 4, ZeRO-1: the experts'
   matrices stepped by two owners in each expert-data group) holds each matrix's GaLore state
   once and the same matrices' as one process's, and one process resumed from it continues the
   straight run within 1e-5; E = 2 resumed from one process's checkpoint does too.

Exit 77 (skipped) without mpirun.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint_compare  # noqa: E402
from layout_families import check_families  # noqa: E402
from mpi_harness import (binaries_or_skip, check, check_continued, failures, losses,  # noqa: E402
                         run, tiny_run)

MOE = ["model.arch=llama", "model.moe.experts=4", "model.moe.top_k=2", "model.moe.ffn_hidden=32",
       "model.moe.shared_experts=1", "model.moe.aux_loss=0.05", "model.moe.z_loss=0.01"]
OPTIMIZERS = {
    "muon": ["optimizer.name=muon"],
    "galore": ["optimizer.name=galore", "optimizer.galore.rank=4",
               "optimizer.galore.update_gap=4"],
}
D2E2 = ["parallel.data=2", "parallel.expert=2"]
FAMILIES = [
    ("E=2 D=2 ZeRO-0", 2, D2E2 + ["parallel.zero_stage=0"]),
    ("E=2 D=2 ZeRO-1", 2, D2E2 + ["parallel.zero_stage=1"]),
    ("E=2 D=2 ZeRO-2", 2, D2E2 + ["parallel.zero_stage=2"]),
    ("E=2 D=2 ZeRO-3", 2, D2E2 + ["parallel.zero_stage=3"]),
    ("E=2 D=4 ZeRO-1", 4, ["parallel.data=4", "parallel.expert=2", "training.global_batch=8"]),
    ("E=2 D=4 ZeRO-3", 4, ["parallel.data=4", "parallel.expert=2", "parallel.zero_stage=3",
                           "training.global_batch=8"]),
    ("E=4 D=4", 4, ["parallel.data=4", "parallel.expert=4", "training.global_batch=8"]),
    ("E=2 D=2 M=2 +SP", 4, D2E2 + ["parallel.tensor=2", "parallel.sequence_parallel=true"]),
    ("E=2 D=2 P=2 1f1b", 4, D2E2 + ["parallel.pipeline=2", "parallel.stage_layers=uniform"]),
    # Hybrid sharding: each shard group's expert-shard groups (N/E ranks) take the experts'
    # turns, as the shard group the rest's, and the replicas do the same.
    ("E=2 D=4 hybrid shard 2 ZeRO-1", 4, ["parallel.data=4", "parallel.expert=2",
                                          "parallel.data_shard=2", "training.global_batch=8"]),
    ("E=2 C=2 D=4 hybrid shard 4 ZeRO-3", 8, ["parallel.context=2", "parallel.data=4",
                                              "parallel.expert=2", "parallel.data_shard=4",
                                              "parallel.zero_stage=3",
                                              "training.global_batch=8"]),
]
SPLIT = ["parallel.data=4", "parallel.expert=2", "training.global_batch=8"]


def sets(overrides):
    return [a for o in overrides for a in ("--set", o)]


def steps(metrics):
    return {r["step"]: r["loss"] for r in losses(metrics) if "loss" in r}


def matrix_state_names(checkpoint):
    """The per-matrix state's tensors in `checkpoint`, each written once (load refuses twice)."""
    state, _ = checkpoint_compare.load(checkpoint)
    return {(kind, name) for kind in state if kind.startswith("MATRIX/") for name in state[kind]}


def check_checkpoints(trident, tmp, name, base):
    """Step 5 written with the experts split, resumed by one process, and the reverse."""
    runs = {}
    for label, ranks, layout in (("E=2 D=4", 4, SPLIT), ("one process", 1,
                                                          ["training.global_batch=8"])):
        directory = os.path.join(tmp, f"{name}_{label.replace(' ', '_').replace('=', '')}")
        metrics = directory + ".jsonl"
        run([trident, "train"] + base + sets(layout + [
            f"checkpoint.dir={directory}", "checkpoint.interval=5",
            f"logging.metrics={metrics}"]), ranks=ranks)
        runs[label] = (os.path.join(directory, "step_000005"), steps(metrics))
    if name == "galore":
        split, whole = (matrix_state_names(runs[k][0]) for k in ("E=2 D=4", "one process"))
        experts = {n for n in whole if ".experts." in n[1]}
        check(split == whole and experts,
              f"galore: the E=2 D=4 checkpoint's per-matrix state is one process's, each "
              f"matrix's once ({len(split)} tensors, {len(experts)} of them experts'; "
              f"differing: {sorted(split ^ whole)[:3]})")
    for source, target, ranks, layout in (("E=2 D=4", "one process", 1,
                                           ["training.global_batch=8"]),
                                          ("one process", "E=2 D=4", 4, SPLIT)):
        metrics = os.path.join(tmp, f"{name}_resumed_{ranks}.jsonl")
        run([trident, "train"] + base + sets(layout + [
            f"checkpoint.resume={runs[source][0]}", "checkpoint.dir=null",
            f"logging.metrics={metrics}"]), ranks=ranks)
        check_continued(f"{name}: {target} resumed from {source}'s step 5", steps(metrics),
                        runs[source][1])


def main():
    trident, _ = binaries_or_skip()
    with tempfile.TemporaryDirectory() as tmp:
        for name, optimizer in OPTIMIZERS.items():
            directory = os.path.join(tmp, name)
            os.makedirs(directory)
            base = tiny_run(directory, MOE + optimizer + ["checkpoint.dir=null"])
            check_families(trident, base, directory, f"{name} with the experts split",
                           families=FAMILIES)
            check_checkpoints(trident, directory, name, base)
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
