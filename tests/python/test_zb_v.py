#!/usr/bin/python3
"""ZB-V under mpirun: two chunks per stage in a V (stage r holds chunks r and 2P-1-r, the
embedding and the head both on stage 0) train the model 1F1B and one process train.

Where the reduction order is 1F1B's (llama's untied head, no gradient clipping: each gradient adds
its microbatches in the same order) the checkpoints of P = 2 and P = 4, and of P = 2 with
D = 2 under ZeRO-2, equal 1F1B's bitwise, every element of the weights, master
weights and Adam moments (tests/python/checkpoint_compare.py). With the tied embedding and
clipping (the tied weight's two gradients now summed on one stage, the norm's squares in
another order) P = 4's losses are within 1e-5 of one process's and step 1's Adam moments within
1e-5 of one process's. A ZB-V checkpoint
resumes under 1F1B and a 1F1B one under ZB-V, bitwise the run that did not stop.
zb-v with virtual_stages other than 2, or on one stage, is refused with one message.

Needs only the standard library and mpirun; exit 77 (skipped) without mpirun.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_harness import (binaries_or_skip, check, checkpoints_differ, failures, losses,  # noqa: E402
                         run, tiny_run)

# Llama's untied head, unclipped: 1F1B's reduction order, so bitwise.
MOMENTS = ("exp_avg", "exp_avg_sq")
SAME_ORDER = ["model.arch=llama", "model.kv_heads=2", "model.ffn_hidden=48",
              "training.grad_clip=0"]


def main():
    trident, _ = binaries_or_skip()

    with tempfile.TemporaryDirectory() as tmp:
        path = lambda name: os.path.join(tmp, name)  # noqa: E731
        # 8 layers (2P chunks for P = 4), 4 microbatches a step, 3 steps, a checkpoint
        # every step.
        base = tiny_run(tmp, ["model.layers=8", "training.global_batch=8", "training.steps=3",
                              "checkpoint.interval=1", "checkpoint.keep=3"])

        def train(name, ranks, overrides):
            args = [trident, "train"] + base + ["--set", f"checkpoint.dir={path(name)}",
                                                "--set", f"logging.metrics={path(name)}.jsonl"]
            for o in overrides:
                args += ["--set", o]
            run(args, ranks=ranks)
            return losses(path(name) + ".jsonl")

        def grid(p, schedule, d=1, zero=1):
            return [f"parallel.pipeline={p}", f"parallel.schedule={schedule}",
                    f"parallel.data={d}", f"parallel.zero_stage={zero}"]

        step = lambda name, s: path(f"{name}/step_{s:06d}")  # noqa: E731

        # Bitwise 1F1B's where the reduction order is the same.
        for p, d, zero in [(2, 1, 1), (4, 1, 1), (2, 2, 2)]:
            name = f"P={p} D={d} ZeRO-{zero}"
            ref = train(f"same_1f1b_{p}{d}{zero}", p * d, SAME_ORDER + grid(p, "1f1b", d, zero))
            got = train(f"same_zbv_{p}{d}{zero}", p * d, SAME_ORDER + grid(p, "zb-v", d, zero))
            differ = checkpoints_differ(step(f"same_zbv_{p}{d}{zero}", 3),
                                        step(f"same_1f1b_{p}{d}{zero}", 3))
            check(len(got) == 3 and [r["loss"] for r in got] == [r["loss"] for r in ref]
                  and differ is None,
                  f"{name}, llama untied, unclipped: ZB-V's losses and step 3's checkpoint equal "
                  f"1F1B's bitwise: weights, master weights, Adam moments ({differ or 'all'})")

        # A checkpoint of either resumes under the other, bitwise the run that went on.
        for before, after in [("zb-v", "1f1b"), ("1f1b", "zb-v")]:
            tag = lambda s: s.replace("-", "")  # noqa: E731
            train(f"resumed_{tag(before)}", 2, SAME_ORDER + grid(2, after) + [
                f"checkpoint.resume={step(f'same_{tag(before)}_211', 2)}"])
            differ = checkpoints_differ(step(f"resumed_{tag(before)}", 3),
                                        step(f"same_{tag(after)}_211", 3))
            check(differ is None, f"P=2: {before}'s step-2 checkpoint resumed under {after}: step "
                                  f"3 bitwise the {after} run's ({differ or 'all'})")

        # The tied embedding and clipping: losses within 1e-5 of one process's, and step 1's
        # Adam moments (the whole gradient, element by element) within 1e-5 of one process's
        # (as 1F1B's are, tests/python/test_pipeline_parallel.py; later steps' Adam divides
        # by moments near 0 where a gradient is tiny, which magnifies a last-bit difference).
        one = train("one", 1, [])
        for p in (4,):
            got = train(f"tied_zbv_{p}", p, grid(p, "zb-v"))
            worst = max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(got, one))
            differ = checkpoints_differ(step(f"tied_zbv_{p}", 1), step("one", 1), 1e-5, MOMENTS)
            check(len(got) == 3 and worst <= 1e-5 and differ is None,
                  f"P={p}, tied, clipped: ZB-V's 3 losses within 1e-5 of one process's (worst "
                  f"{worst:.2e}); step 1's Adam moments within 1e-5 of one process's, every "
                  f"element ({differ or 'all'})")

        # Refused when the config is read, naming the cause.
        for overrides, message in [
                (grid(2, "zb-v") + ["parallel.virtual_stages=3"],
                 "parallel.virtual_stages must be 2 or unset (got 3)"),
                (grid(1, "zb-v"), "zb-v needs parallel.pipeline >= 2 (got 1)")]:
            p = run([trident, "train"] + base + sum((["--set", o] for o in overrides), []),
                    expect_ok=False)
            check(p.returncode != 0 and message in p.stdout,
                  f"{' '.join(overrides)}: refused with '{message}'")

    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
