#!/usr/bin/python3
"""Mixed precision under mpirun: bf16 and fp16 train like fp32 on 1×1×1 and on the 2×2×2 grid.

The data is learnable (a cycle of 37 tokens, each the next one's sole predecessor), so the
loss falls by far more than the tolerance: every run's loss falls by more than 15% over 20
steps, and the 16-bit losses stay within 2% of the fp32 run's at every step (each layout
against its own fp32 run, and fp32 2×2×2 against fp32 1×1×1 within 1e-5 as ever). A run
that never updated would fail both. The bytes say what is held and moved: parameters 2 bytes
each, gradients 2 (4 with fp32_grad_accumulation), optimizer state 12 bytes per parameter / D
in every precision, data-parallel traffic 2 bytes per element. A forced overflow (fp16 with a
loss scale far too large) skips steps, halves the scale each time, and training then goes on
and learns.

Needs only the standard library and mpirun; exit 77 (skipped) without mpirun.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_harness import (binaries_or_skip, check, failures, losses, run, tiny_run,  # noqa: E402
                         write_shard)

GRIDS = [(1, 1, 1), (2, 2, 2)]
TOLERANCE = 0.02  # 16-bit against fp32, relative, at every step
FALL = 0.15       # every run's loss falls by more than this over its 20 steps


def fell(rows):
    """How much of its first loss a run lost by its last step."""
    return 1 - rows[-1]["loss"] / rows[0]["loss"]


def main():
    trident, _ = binaries_or_skip()
    with tempfile.TemporaryDirectory() as tmp:
        path = lambda name: os.path.join(tmp, name)  # noqa: E731
        write_shard(path("cycle.bin"), [(i % 37) * 5 for i in range(3000)])
        base = tiny_run(tmp, ["model.layers=4", "training.steps=20", "training.global_batch=8",
                              "model.dropout=0.1", f"data.train={path('cycle.bin')}"])

        def train(p, m, d, name, *overrides):
            metrics = path(name + ".jsonl")
            args = [trident, "train"] + base + [
                "--set", f"parallel.pipeline={p}", "--set", f"parallel.tensor={m}",
                "--set", f"parallel.data={d}", "--set", f"logging.metrics={metrics}"]
            for o in overrides:
                args += ["--set", o]
            run(args, ranks=p * m * d if p * m * d > 1 else None)
            return losses(metrics)

        reference = None
        for p, m, d in GRIDS:
            grid = f"{p}x{m}x{d}"
            fp32 = train(p, m, d, f"fp32_{grid}")
            check(fell(fp32) > FALL, f"fp32 {grid}: the loss falls by {100 * fell(fp32):.1f}% "
                  f"({fp32[0]['loss']:.4f} -> {fp32[-1]['loss']:.4f})")
            if reference is None:
                reference = fp32
            else:
                worst = max(abs(x["loss"] - y["loss"]) / y["loss"] for x, y in zip(fp32, reference))
                check(len(fp32) == len(reference) and worst <= 1e-5, f"fp32 {grid}: losses within 1e-5 of 1x1x1 (worst {worst:.1e})")
            for precision, accumulate in [("bf16", False), ("fp16", False), ("bf16", True)]:
                name = f"{precision}{' +fp32 grads' if accumulate else ''} {grid}"
                rows = train(p, m, d, f"{precision}_{accumulate}_{grid}",
                             f"training.precision={precision}",
                             f"training.fp32_grad_accumulation={'true' if accumulate else 'false'}")
                worst = max(abs(x["loss"] - y["loss"]) / y["loss"] for x, y in zip(rows, fp32))
                check(len(rows) == 20 and 0 < worst <= TOLERANCE,
                      f"{name}: 20-step losses within 2% of fp32, and not its bits "
                      f"(worst {100 * worst:.3f}%)")
                check(fell(rows) > FALL, f"{name}: the loss falls by {100 * fell(rows):.1f}%")
                check(not any(r["skipped"] for r in rows), f"{name}: no step skipped")
                r, f = rows[-1], fp32[-1]
                n = f["mem_params_bytes"] // 4  # elements of the stage's flat buffer
                grad_bytes = 4 if accumulate else 2
                check(abs(r["mem_params_bytes"] - 2 * n) < 64 and
                      abs(r["mem_grads_bytes"] - grad_bytes * n) < 64 and
                      r["mem_optimizer_bytes"] == f["mem_optimizer_bytes"],
                      f"{name}: parameters {r['mem_params_bytes']} B (2 x {n}), gradients "
                      f"{r['mem_grads_bytes']} B ({grad_bytes} x {n}), optimizer "
                      f"{r['mem_optimizer_bytes']} B as fp32's")
                check(r["mem_activations_bytes"] < 0.65 * f["mem_activations_bytes"],
                      f"{name}: activations {r['mem_activations_bytes']} B, fp32 "
                      f"{f['mem_activations_bytes']} B")
                if d > 1:
                    check(r["dp_reduce_scatter_bytes"] * 4 == f["dp_reduce_scatter_bytes"] * grad_bytes
                          and r["dp_all_gather_bytes"] * 2 == f["dp_all_gather_bytes"],
                          f"{name}: data-parallel reduce-scatter {r['dp_reduce_scatter_bytes']} B "
                          f"and all-gather {r['dp_all_gather_bytes']} B at the buffers' widths")

        # A forced overflow on the grid: the first steps skip, the scale halves each time.
        rows = train(2, 2, 2, "overflow", "training.precision=fp16", "training.loss_scale=16777216")
        skipped = [r["skipped"] for r in rows]
        scales = [r["loss_scale"] for r in rows]
        halved = all(scales[i + 1] == (scales[i] / 2 if skipped[i] else scales[i])
                     for i in range(len(rows) - 1))
        applied = [r for r in rows if not r["skipped"]]
        check(skipped[0] and halved and rows[-1]["skipped_total"] == sum(skipped),
              f"fp16 overflow on 2x2x2: {sum(skipped)} steps skipped, scale "
              f"{scales[0]:.0f} -> {scales[-1]:.0f}, halved at each skip")
        # Fewer updates than fp32's 20, so it learns less: half the fall is asked of it.
        check(len(applied) >= 5 and fell(rows) > FALL / 2,
              f"fp16 overflow on 2x2x2: training went on and learns ({len(applied)} steps "
              f"applied, the loss falls by {100 * fell(rows):.1f}%)")

    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
