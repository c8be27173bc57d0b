#!/usr/bin/python3
"""Context parallelism under mpirun: every split of the sequence trains the same model.

On data the model learns (a cycle of 23 tokens): for C = 2 and 4 in both modes (ring,
ulysses), and on the 4D grids 2x2x2x1 and 1x2x2x2 (P x M x C x D), the loss and every
gathered gradient of one global batch (tests/tools/model_dump) match one process within 1e-5
relative, and so do the losses of 10 training steps (with dropout, ZeRO-1, sequence
parallelism, selective and full recompute too; bf16 and fp16 within their rounding). The
activation memory a rank measures is a C-th of one process's; the traffic the Comm layer
counts per step on the context group equals the formula of docs/FORMULAS.md; a checkpoint
written under one C resumes under another with the uninterrupted losses; bad configs give one
clear message and a non-zero exit.

Needs only the standard library and mpirun; exit 77 (skipped) without mpirun.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_harness import (binaries_or_skip, check, failures, losses, read_safetensors, run,  # noqa: E402
                         tiny_run, worst_tensor_diff, write_shard)

TOL = 1e-5


def sets(overrides):
    args = []
    for o in overrides:
        args += ["--set", o]
    return args


def layout(p, m, c, d, mode="ring", *extra):
    return [f"parallel.pipeline={p}", f"parallel.tensor={m}", f"parallel.context={c}",
            f"parallel.data={d}", f"parallel.context_mode={mode}", *extra]


def ranks_of(lay):
    """P·M·C·D of a layout()."""
    n = 1
    for o in lay[:4]:
        n *= int(o.split("=")[1])
    return n


def worst_rel(curve, ref):
    """The largest relative difference; infinite where the lengths differ (or are none)."""
    if len(curve) != len(ref) or not ref:
        return float("inf")
    return max(abs(x - y) / abs(y) for x, y in zip(curve, ref))


def main():
    trident, dump = binaries_or_skip()

    with tempfile.TemporaryDirectory() as tmp:
        path = lambda name: os.path.join(tmp, name)  # noqa: E731
        # 2 layers of hidden 32, 4 heads, sequence 16, global batch 4 in microbatches of 2.
        plain = tiny_run(tmp)
        # A cycle of 23 tokens: each token fixes the next, so the loss falls fast.
        write_shard(path("train.bin"), [(i % 23) * 13 % 300 for i in range(3000)])

        # Non-trivial weights (every bias and LayerNorm moved): one step, exported.
        run([trident, "train"] + plain + sets(["training.steps=1", f"checkpoint.dir={path('ck')}"]))
        run([trident, "export", "--checkpoint", path("ck"), "--output", path("w.safetensors")])
        base = plain + sets([f"model.init_from={path('w.safetensors')}"])

        # 1. Loss and every gradient of one global batch.
        run([dump] + base + ["--output", path("g1.safetensors")], ranks=1)
        ref = read_safetensors(path("g1.safetensors"))
        grids = [("C=2 ring", layout(1, 1, 2, 1, "ring")),
                 ("C=4 ring", layout(1, 1, 4, 1, "ring")),
                 ("C=2 ulysses", layout(1, 1, 2, 1, "ulysses")),
                 ("C=4 ulysses", layout(1, 1, 4, 1, "ulysses")),
                 ("2x2x2x1 ring", layout(2, 2, 2, 1, "ring")),
                 ("2x2x2x1 ulysses +SP", layout(2, 2, 2, 1, "ulysses", "parallel.sequence_parallel=true"))]
        for name, lay in grids:
            out = path("g.safetensors")
            run([dump] + base + sets(lay) + ["--output", out], ranks=ranks_of(lay))
            got = read_safetensors(out)
            check(sorted(got) == sorted(ref), f"{name}: the same {len(ref)} tensors")
            worst = worst_tensor_diff(got, ref)
            check(worst[0] <= TOL, f"{name}: loss and gradients within 1e-5 (worst {worst[0]:.2e}, {worst[1]})")

        # 2. Ten steps of training on every grid, with and without dropout.
        runs = [("C=2 ring", 2, layout(1, 1, 2, 1, "ring")),
                ("C=4 ring", 4, layout(1, 1, 4, 1, "ring")),
                ("C=2 ulysses", 2, layout(1, 1, 2, 1, "ulysses")),
                ("C=4 ulysses", 4, layout(1, 1, 4, 1, "ulysses")),
                ("2x2x2x1 ring", 8, layout(2, 2, 2, 1, "ring")),
                ("1x2x2x2 ring +SP", 8, layout(1, 2, 2, 2, "ring", "parallel.sequence_parallel=true")),
                ("1x2x2x2 ulysses", 8, layout(1, 2, 2, 2, "ulysses")),
                ("C=2 D=2 ring selective", 4, layout(1, 1, 2, 2, "ring", "training.recompute=selective")),
                ("C=2 ulysses selective", 2, layout(1, 1, 2, 1, "ulysses", "training.recompute=selective")),
                ("C=4 ring full ZeRO-0", 4, layout(1, 1, 4, 1, "ring", "training.recompute=full",
                                                   "parallel.zero_stage=0"))]
        for dropout in ("0.0", "0.1"):
            common = base + sets([f"model.dropout={dropout}"])
            run([trident, "train"] + common + sets([f"logging.metrics={path('m1.jsonl')}"]))
            ref_curve = [r["loss"] for r in losses(path("m1.jsonl"))]
            if dropout == "0.0":
                check(ref_curve[-1] < ref_curve[0] - 0.5,
                      f"the data is learnt: loss {ref_curve[0]:.3f} -> {ref_curve[-1]:.3f} in 10 steps")
            for name, ranks, lay in runs:
                if dropout != "0.0" and "full" in name:
                    continue
                metrics = path("m.jsonl")
                run([trident, "train"] + common + sets(lay + [f"logging.metrics={metrics}"]),
                    ranks=ranks)
                curve = [r["loss"] for r in losses(metrics)]
                worst = worst_rel(curve, ref_curve)
                check(len(curve) == 10 and worst <= TOL,
                      f"{name} dropout {dropout}: 10-step losses within 1e-5 of one process (worst {worst:.2e})")

        # 2b. 16-bit training: C = 2 in both modes against one process in the same precision.
        # The split changes where the 16-bit roundings fall (the attention blocks merge in
        # fp32, the activations between are rounded), so the curves agree to the rounding of
        # the type, not bitwise: within TOL16, far below the 0.5 the loss falls by.
        TOL16 = 1e-3
        for precision in ("bf16", "fp16"):
            common = base + sets([f"training.precision={precision}"])
            run([trident, "train"] + common + sets([f"logging.metrics={path('p1.jsonl')}"]))
            ref16 = [r["loss"] for r in losses(path("p1.jsonl"))]
            check(ref16[-1] < ref16[0] - 0.5, f"{precision}: the data is learnt ({ref16[0]:.3f} -> {ref16[-1]:.3f})")
            for mode in ("ring", "ulysses"):
                metrics = path("p.jsonl")
                run([trident, "train"] + common + sets(layout(1, 1, 2, 1, mode) + [f"logging.metrics={metrics}"]),
                    ranks=2)
                curve = [r["loss"] for r in losses(metrics)]
                worst = worst_rel(curve, ref16)
                check(len(curve) == 10 and worst <= TOL16,
                      f"{precision} C=2 {mode}: 10-step losses within {TOL16} of one process (worst {worst:.2e})")

        # 3. Traffic per step on the context group (docs/FORMULAS.md, "Context parallelism"):
        # per layer and microbatch, ring sends (C-1) blocks of k, v forward and (C-1) backward
        # (N_l x 2C/M activations each) and C blocks of their gradients (fp32); Ulysses
        # all-to-alls q, k, v and the output forward and their gradients backward: 8 N_l C/M.
        # Full recompute runs the forward once more.
        Bm, T, C, L, m = 2, 16, 32, 2, 2
        for name, ranks, cp, mode, extra, forwards in [
                ("C=2 ring", 2, 2, "ring", [], 1), ("C=4 ring", 4, 4, "ring", [], 1),
                ("C=4 ring full recompute", 4, 4, "ring", ["training.recompute=full"], 2),
                ("C=2 ulysses", 2, 2, "ulysses", [], 1), ("C=4 ulysses", 4, 4, "ulysses", [], 1),
                ("M=2 C=2 ulysses", 4, 2, "ulysses", ["parallel.tensor=2"], 1)]:
            M = 2 if "parallel.tensor=2" in extra else 1
            rows = Bm * T // cp
            if mode == "ring":
                send = m * L * ((forwards + 1) * (cp - 1) * rows * 2 * C // M * 4 + cp * rows * 2 * C // M * 4)
                a2a = 0
            else:
                send = 0
                a2a = m * L * (forwards * 4 + 4) * rows * C // M * 4
            metrics = path("t.jsonl")
            run([trident, "train"] + base + sets(layout(1, M, cp, 1, mode, *extra) + [
                f"logging.metrics={metrics}"]), ranks=ranks)
            rows_seen = losses(metrics)
            for key, value in (("cp_send_bytes", send), ("cp_all_to_all_bytes", a2a)):
                seen = {r.get(key) for r in rows_seen}
                check(seen == {value}, f"{name}: {key} per step = {value} (seen {sorted(seen)})")

        # 4. Activation memory per rank: a C-th of one process's. Sequence 64, so attention's
        # (B, NH, T, T) probabilities (what the CPU backend keeps) weigh in: Ulysses keeps a
        # C-th of the heads over the whole sequence, a C-th of them; ring keeps only each
        # row's log-sum-exp, so it is held against one process under selective recompute
        # (which drops the probabilities): both then keep a C-th of every other activation.
        long = plain + sets(["model.seq_len=64", "training.steps=1"])

        def activations(ranks, overrides):
            metrics = path("a.jsonl")
            run([trident, "train"] + long + sets(overrides + [f"logging.metrics={metrics}"]),
                ranks=ranks)
            return losses(metrics)[-1]["mem_activations_bytes"]

        for recompute, mode in (("none", "ulysses"), ("selective", "ring")):
            one = activations(1, [f"training.recompute={recompute}"])
            for cp in (2, 4):
                got = activations(cp, [f"training.recompute={recompute}", f"parallel.context={cp}",
                                       f"parallel.context_mode={mode}"])
                ratio = got / one
                check(1 / cp <= ratio <= 1.1 / cp,
                      f"{mode} C={cp} ({recompute} recompute): activations {got} bytes, "
                      f"{ratio:.3f} of one process's {one} (1/C = {1 / cp:.3f})")
        ring = activations(4, ["parallel.context=4"])
        one = activations(1, [])
        check(ring <= one / 4, f"ring C=4 without recompute: {ring} bytes <= a quarter of {one}")

        # 5. A checkpoint reshards across C: written by C=2 ring at step 4, resumed by one
        # process and by M=2 x C=2 Ulysses, with the uninterrupted losses.
        run([trident, "train"] + base + sets([f"logging.metrics={path('r.jsonl')}"]))
        ref_curve = [r["loss"] for r in losses(path("r.jsonl"))]
        run([trident, "train"] + base + sets(layout(1, 1, 2, 1, "ring") + [
            f"checkpoint.dir={path('ckc')}", "checkpoint.interval=4"]), ranks=2)
        info = run([trident, "checkpoint", "info", path("ckc/step_000004")])
        check("layout: 1 x 1 x 2 x 1" in info.stdout and "context ring" in info.stdout,
              "checkpoint info prints the context split")
        for i, (name, ranks, lay) in enumerate([
                ("C=2 -> 1 process", 1, layout(1, 1, 1, 1)),
                ("C=2 -> M=2 x C=2 ulysses", 4, layout(1, 2, 2, 1, "ulysses")),
                ("C=2 -> C=4 x D=2", 8, layout(1, 1, 4, 2, "ring"))]):
            metrics = path(f"res{i}.jsonl")
            run([trident, "train"] + base + sets(lay + [
                f"checkpoint.resume={path('ckc/step_000004')}", f"checkpoint.dir={path(f'ckr{i}')}",
                f"logging.metrics={metrics}"]), ranks=ranks)
            curve = [r["loss"] for r in losses(metrics)]
            check(len(curve) == 6 and worst_rel(curve, ref_curve[4:]) <= TOL,
                  f"{name}: the uninterrupted losses ({curve} vs {ref_curve[4:]})")

        # 6. Bad configs: one message naming the cause, every rank exits non-zero, no hang.
        for ranks, overrides, expect in [
                (4, ["parallel.context=4", "model.seq_len=12"],
                 "model.seq_len (12) must be a multiple of 2 × parallel.context = 2 × 4 = 8"),
                (8, ["parallel.context=4", "parallel.tensor=2", "parallel.context_mode=ulysses"],
                 "parallel.context_mode: ulysses splits the heads over parallel.tensor × context = 2 × 4 = 8 ranks, which must divide model.heads (4)"),
                (2, ["parallel.context=2", "parallel.data=2"],
                 "pipeline × tensor × context × data = 1 × 1 × 2 × 2 = 4, but 2 processes were started"),
                (2, ["parallel.context=2", "parallel.context_mode=spiral"], "parallel.context_mode")]:
            p = run([trident, "train"] + base + sets(overrides), ranks=ranks, expect_ok=False)
            check(p.returncode != 0 and p.stdout.count("trident: error") == 1 and expect in p.stdout,
                  f"{' '.join(overrides)}: one message naming the cause, exit {p.returncode}")

    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
