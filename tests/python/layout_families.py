"""Every layout family once, for a model feature: the losses of 10 training steps on each
layout within 1e-5 relative of one process's on the same global batch (the promise every
feature keeps, docs/ARCHITECTURE.md "Determinism"). A feature's test calls check_families with
the tiny run's arguments and its own overrides; each family is one run under mpirun.

The families: tensor parallelism (M = 2, with and without sequence parallelism, and with
tp_overlap), pipeline parallelism (P = 2 with 1F1B, GPipe, interleaved, ZB-H1, ZB-H2, ZB-V),
data parallelism with ZeRO 0 to 3 and hybrid sharding, context parallelism (ring and Ulysses;
ring with M = 2 too), and full and selective recompute.

Standard library only.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_harness import check, losses, run  # noqa: E402

# (name, ranks, overrides)
FAMILIES = [
    ("M=2", 2, ["parallel.tensor=2"]),
    ("M=2 +SP", 2, ["parallel.tensor=2", "parallel.sequence_parallel=true"]),
    ("M=2 +SP tp_overlap", 2, ["parallel.tensor=2", "parallel.sequence_parallel=true",
                               "parallel.tp_overlap=true"]),
    ("P=2 1f1b", 2, ["parallel.pipeline=2"]),
    ("P=2 gpipe", 2, ["parallel.pipeline=2", "parallel.schedule=gpipe"]),
    ("P=2 interleaved v=2", 2, ["parallel.pipeline=2", "parallel.schedule=interleaved",
                                "parallel.virtual_stages=2"]),
    ("P=2 zb-h1", 2, ["parallel.pipeline=2", "parallel.schedule=zb-h1"]),
    ("P=2 zb-h2", 2, ["parallel.pipeline=2", "parallel.schedule=zb-h2"]),
    ("P=2 zb-v", 2, ["parallel.pipeline=2", "parallel.schedule=zb-v"]),
    ("D=2 ZeRO-0", 2, ["parallel.data=2", "parallel.zero_stage=0"]),
    ("D=2 ZeRO-1", 2, ["parallel.data=2", "parallel.zero_stage=1"]),
    ("D=2 ZeRO-2", 2, ["parallel.data=2", "parallel.zero_stage=2"]),
    ("D=2 ZeRO-3", 2, ["parallel.data=2", "parallel.zero_stage=3"]),
    ("D=4 hybrid shard 2", 4, ["parallel.data=4", "parallel.zero_stage=3",
                               "parallel.data_shard=2", "training.global_batch=8"]),
    ("C=2 ring", 2, ["parallel.context=2"]),
    ("C=2 ulysses", 2, ["parallel.context=2", "parallel.context_mode=ulysses"]),
    ("M=2 C=2 ring", 4, ["parallel.tensor=2", "parallel.context=2"]),
    ("recompute full", 1, ["training.recompute=full"]),
    ("recompute selective", 1, ["training.recompute=selective"]),
]


def sets(overrides):
    return [arg for o in overrides for arg in ("--set", o)]


def curve(path):
    return [r["loss"] for r in losses(path) if "loss" in r]


def worst_rel(curve_a, curve_b):
    return max(abs(x - y) / abs(y) for x, y in zip(curve_a, curve_b))


def one_process(trident, base, directory, overrides=()):
    """The reference: one process's 10-step loss curve (and its metrics file)."""
    metrics = os.path.join(directory, "families_reference.jsonl")
    run([trident, "train"] + base + sets(list(overrides) + [f"logging.metrics={metrics}"]),
        ranks=1)
    return curve(metrics)


def check_families(trident, base, directory, label, reference=None, families=FAMILIES):
    """Trains `base` (tiny_run's arguments with the feature's overrides) on every family and
    holds each 10-step curve to one process's (`reference`, or one process run here). Returns
    the reference curve."""
    if reference is None:
        reference = one_process(trident, base, directory)
    check(len(reference) == 10, f"{label}, one process: 10 steps ({len(reference)})")
    for i, (name, ranks, overrides) in enumerate(families):
        metrics = os.path.join(directory, f"families_{i}.jsonl")
        batch = [o for o in overrides if o.startswith("training.global_batch")]
        ref = reference if not batch else one_process(trident, base, directory, batch)
        run([trident, "train"] + base + sets(overrides + [f"logging.metrics={metrics}"]),
            ranks=ranks)
        got = curve(metrics)
        worst = worst_rel(got, ref) if len(got) == 10 and ref else float("inf")
        check(worst <= 1e-5, f"{label}, {name}: 10-step losses within 1e-5 of one process "
                             f"(worst {worst:.2e})")
    return reference
