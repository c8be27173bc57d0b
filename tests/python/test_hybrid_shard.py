#!/usr/bin/python3
"""ZeRO over the data-context group and hybrid sharding (parallel.data_shard), under mpirun.

Every layout below trains the model of one process: step 1's Adam moments, every element,
within 1e-5 of one process (tests/python/checkpoint_compare.py), and 4 steps' losses and
gradient norms within 1e-5 (dropout 0.1, 2 microbatches per replica or more).
- ZeRO-2 and 3 sharded over the D·C ranks of the data-context group: C = 2 (ring and
  Ulysses) with D = 1 and 2; stage 2 and stage 3 of a layout the same checkpoint bitwise
  (the same reductions in the same order).
- Hybrid sharding: D = 4 with data_shard 2 at ZeRO 1, 2 and 3, and D = 2, C = 2 with
  data_shard 2. The gradient shard is a half of the buffer (4·Ψ/2 bytes) and the step's
  traffic is a reduce-scatter of Ψ per microbatch within the shard group plus one all-reduce
  of Ψ/2 across the replicas (and the loss and norm, a double each).
- A checkpoint of data_shard 2 resumes with data_shard 4 and at ZeRO 0 with the uninterrupted
  losses; a data_shard that does not divide D·C, one with ZeRO 0, or one that parallel.expert
  does not divide, is refused at start-up with one message naming the keys.

Needs only the standard library and mpirun; exit 77 (skipped) without mpirun.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_harness import (binaries_or_skip, check, checkpoints_differ, failures, losses, run,  # noqa: E402
                         tiny_run, worst)

TOL = 1e-5
STEPS = 4


def main():
    trident, _ = binaries_or_skip()
    with tempfile.TemporaryDirectory() as tmp:
        path = lambda name: os.path.join(tmp, name)  # noqa: E731
        base = tiny_run(tmp, ["model.layers=4", "model.dropout=0.1", "training.global_batch=16",
                              f"training.steps={STEPS}", "data.shuffle=true",
                              "checkpoint.interval=1", "checkpoint.keep=10"])

        def train(name, d, c=1, extra=(), expect_ok=True, ranks=None):
            args = [trident, "train"] + base
            for o in [f"parallel.data={d}", f"parallel.context={c}", *extra,
                      f"checkpoint.dir={path('ck_' + name)}",
                      f"logging.metrics={path(name + '.jsonl')}"]:
                args += ["--set", o]
            ranks = ranks or d * c
            p = run(args, ranks=None if ranks == 1 else ranks, expect_ok=expect_ok)
            return p if not expect_ok else losses(path(name + ".jsonl"))

        def same_model(name, rows, ref):
            differ = checkpoints_differ(path(f"ck_{name}/step_000001"), path("ck_ref/step_000001"),
                                        TOL, ("exp_avg", "exp_avg_sq"))
            check(differ is None, f"{name}: step 1's Adam moments, every element, within 1e-5 of "
                                  f"one process ({differ or 'all'})")
            check(len(rows) == STEPS and worst(rows, ref, "loss") <= TOL
                  and worst(rows, ref, "grad_norm") <= TOL,
                  f"{name}: losses and gradient norms within 1e-5 of one process "
                  f"(worst {worst(rows, ref, 'loss'):.2e})")

        ref = train("ref", 1)

        # ZeRO-2 and 3 over the data-context group (C = 2).
        for mode in ("ring", "ulysses"):
            for d in (1, 2):
                for zero in (2, 3):
                    name = f"c2_{mode}_d{d}_z{zero}"
                    rows = train(name, d, 2, [f"parallel.context_mode={mode}",
                                              f"parallel.zero_stage={zero}"])
                    same_model(name, rows, ref)
                differ = checkpoints_differ(path(f"ck_c2_{mode}_d{d}_z2/step_{STEPS:06d}"),
                                            path(f"ck_c2_{mode}_d{d}_z3/step_{STEPS:06d}"))
                check(differ is None, f"C=2 {mode} D={d}: ZeRO-2 and 3 the same checkpoint "
                                      f"bitwise ({differ or 'all'})")

        # Hybrid sharding: shards of 2 ranks, replicated twice.
        for name, d, c, zero in (("d4_n2_z1", 4, 1, 1), ("d4_n2_z2", 4, 1, 2),
                                 ("d4_n2_z3", 4, 1, 3), ("d2c2_n2_z2", 2, 2, 2)):
            rows = train(name, d, c, ["parallel.data_shard=2", f"parallel.zero_stage={zero}"])
            same_model(name, rows, ref)
            if zero < 2:
                continue
            r = rows[-1]
            psi = r["mem_grads_bytes"] * 2 // 4  # elements of the unit-padded buffer
            mb = 16 // (2 * d)
            rs, ar = r["dp_reduce_scatter_bytes"], r["dp_all_reduce_bytes"]
            check(rs == 4 * psi * mb and ar == 4 * psi // 2 + 16,
                  f"{name}: reduce-scatter {rs} bytes = 4 x {psi} x {mb} within the shard group, "
                  f"all-reduce {ar} = 4 x {psi} / 2 across the replicas + 16 (loss and norm)")

        # Resume across N and ZeRO stage: data_shard 2 -> 4, and -> ZeRO 0.
        start = 2
        for name, extra in (("resume_n4", ["parallel.data_shard=4", "parallel.zero_stage=2"]),
                            ("resume_z0", ["parallel.zero_stage=0"])):
            rows = train(name, 4, 1, extra + [
                f"checkpoint.resume={path(f'ck_d4_n2_z2/step_{start:06d}')}"])
            check(len(rows) == STEPS - start and worst(rows, ref[start:], "loss") <= TOL,
                  f"data_shard 2 -> {name}: the uninterrupted losses from step {start}")
            differ = checkpoints_differ(path(f"ck_{name}/step_{STEPS:06d}"),
                                        path(f"ck_ref/step_{STEPS:06d}"), TOL,
                                        ("exp_avg", "exp_avg_sq"))
            check(differ is None, f"data_shard 2 -> {name}: step {STEPS}'s Adam moments within "
                                  f"1e-5 of one process ({differ or 'all'})")

        # Refused at start-up (by the config's check, before the grid is made), naming the keys.
        for extra, words in ((["parallel.data_shard=3"], "must divide parallel.data"),
                             (["parallel.data_shard=2", "parallel.zero_stage=0"],
                              "parallel.zero_stage 0 shards nothing"),
                             (["model.arch=llama", "model.moe.experts=4", "parallel.data_shard=2",
                               "parallel.expert=4"],
                              "parallel.expert (4) must divide parallel.data_shard (2)")):
            p = train("refused", 4, 1, extra, expect_ok=False, ranks=1)
            check(p.returncode != 0 and "parallel.data_shard" in p.stdout and words in p.stdout,
                  f"{' '.join(extra)} on D=4: refused with one clear message")

    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
