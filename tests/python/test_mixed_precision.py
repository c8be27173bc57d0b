#!/usr/bin/python3
"""Mixed precision under mpirun: bf16 and fp16 train like fp32 on 1×1×1 and on the 2×2×2 grid.

Over 20 steps the 16-bit losses stay within 2% of the fp32 run's (each layout against its own
fp32 run, and fp32 2×2×2 against fp32 1×1×1 within 1e-5 as ever). The bytes say what is held
and moved: parameters 2 bytes each, gradients 2 (4 with fp32_grad_accumulation), optimizer
state 12 bytes per parameter / D in every precision, data-parallel traffic 2 bytes per
element. A forced overflow (fp16 with a loss scale far too large) skips steps, halves the
scale each time, and training then goes on and learns.

Needs only the standard library and mpirun; exit 77 (skipped) without mpirun.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_harness import binaries_or_skip, check, failures, losses, run, tiny_run  # noqa: E402

GRIDS = [(1, 1, 1), (2, 2, 2)]


def main():
    trident, _ = binaries_or_skip()
    with tempfile.TemporaryDirectory() as tmp:
        path = lambda name: os.path.join(tmp, name)  # noqa: E731
        base = tiny_run(tmp, ["model.layers=4", "training.steps=20", "training.global_batch=8",
                              "model.dropout=0.1"])

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
            if reference is None:
                reference = fp32
            else:
                worst = max(abs(x["loss"] - y["loss"]) / y["loss"] for x, y in zip(fp32, reference))
                check(worst <= 1e-5, f"fp32 {grid}: losses within 1e-5 of 1x1x1 (worst {worst:.1e})")
            for precision, accumulate in [("bf16", False), ("fp16", False), ("bf16", True)]:
                name = f"{precision}{' +fp32 grads' if accumulate else ''} {grid}"
                rows = train(p, m, d, f"{precision}_{accumulate}_{grid}",
                             f"training.precision={precision}",
                             f"training.fp32_grad_accumulation={'true' if accumulate else 'false'}")
                worst = max(abs(x["loss"] - y["loss"]) / y["loss"] for x, y in zip(rows, fp32))
                check(len(rows) == 20 and 0 < worst <= 0.02,
                      f"{name}: 20-step losses within 2% of fp32, and not its bits "
                      f"(worst {100 * worst:.3f}%)")
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
        applied = [r["loss"] for r in rows if not r["skipped"]]
        fp32_last = losses(path("fp32_2x2x2.jsonl"))[-1]["loss"]
        check(skipped[0] and halved and rows[-1]["skipped_total"] == sum(skipped),
              f"fp16 overflow on 2x2x2: {sum(skipped)} steps skipped, scale "
              f"{scales[0]:.0f} -> {scales[-1]:.0f}, halved at each skip")
        check(len(applied) >= 5 and abs(applied[-1] - fp32_last) / fp32_last <= 0.02,
              f"fp16 overflow on 2x2x2: training went on ({len(applied)} steps applied, last "
              f"loss {applied[-1]:.4f}, fp32's {fp32_last:.4f})")

    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
