"""What the matrix optimizers' tests (test_muon.py, test_galore.py) ask alike of checkpoints: a
run resumed from a checkpoint into its own directory, and one process's checkpoint at step 5
resumed on M = 2, D = 2 with ZeRO-1, whose steps 6-10 must be the uninterrupted run's within
1e-5 and whose optimizer state at step 10 must be one process's element by element.

Standard library only (and mpirun, through mpi_harness).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from layout_families import curve  # noqa: E402
from mpi_harness import check, checkpoints_differ, run  # noqa: E402


def resumed(trident, base, tmp, name, source, overrides, ranks=1, expect_ok=True):
    """A run of `base` resumed from checkpoint `source` into its own directory."""
    directory = os.path.join(tmp, name)
    args = base + [a for o in overrides + [f"checkpoint.dir={directory}",
                                           f"checkpoint.resume={source}", "checkpoint.interval=5",
                                           f"logging.metrics={directory}.jsonl"]
                   for a in ("--set", o)]
    return run([trident, "train"] + args, ranks=ranks, expect_ok=expect_ok), directory


def check_reshard(trident, base, tmp, full, label, state, what=""):
    """One process's run of `base` checkpointed at steps 5 and 10, its step 5 resumed on
    M = 2, D = 2: the losses against `full` (the uninterrupted 10) and the pieces `state` of
    the two step-10 checkpoints. Returns the step-5 checkpoint."""
    first = os.path.join(tmp, "ck_one")
    run([trident, "train"] + base + ["--set", f"checkpoint.dir={first}",
                                     "--set", "checkpoint.interval=5"])
    step5, step10 = (os.path.join(first, f"step_{n:06d}") for n in (5, 10))
    grid = ["parallel.tensor=2", "parallel.data=2", "parallel.zero_stage=1"]
    _, moved = resumed(trident, base, tmp, "ck_grid", step5, grid, ranks=4)
    got = curve(moved + ".jsonl")
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, full[5:])) if len(got) == 5 else 1
    check(worst <= 1e-5, f"{label} checkpoint of one process resumed on M=2 D=2: steps 6-10 "
                         f"within 1e-5 of the uninterrupted run (worst {worst:.2e})")
    differ = checkpoints_differ(step10, os.path.join(moved, "step_000010"), 1e-4, state)
    check(differ is None, f"{label} state at step 10 after a reshard{what}, element by element: "
                          f"{differ or 'the same'}")
    return step5
