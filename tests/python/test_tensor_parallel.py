#!/usr/bin/python3
"""Tensor parallelism under mpirun: every split trains the same model as one process.

For M = 2 and 4, with and without sequence parallelism, on a vocabulary that 128·M does not
divide: the loss and every gathered gradient of one global batch (tests/tools/model_dump)
match M = 1 within 1e-5 relative, and so do the losses of 10 training steps, with dropout
too (its masks do not depend on the split). The traffic the Comm layer counts per step
equals Megatron's formula, and bad grids give one clear message and a non-zero exit.

Needs only the standard library and mpirun; exit 77 (skipped) without mpirun.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_harness import (binaries_or_skip, check, failures, losses, read_safetensors, run,  # noqa: E402
                         tiny_run, worst_tensor_diff)

def main():
    trident, dump = binaries_or_skip()

    with tempfile.TemporaryDirectory() as tmp:
        path = lambda name: os.path.join(tmp, name)  # noqa: E731
        # The vocabulary of 300 pads to 384 for M = 1, 512 for M = 2 and 4.
        base = tiny_run(tmp)

        # Non-trivial weights (every bias and LayerNorm moved): one step, exported.
        run([trident, "train"] + base + ["--set", "training.steps=1", "--set",
                                         f"checkpoint.dir={path('ck')}"])
        run([trident, "export", "--checkpoint", path("ck"), "--output", path("w.safetensors")])
        init = ["--set", f"model.init_from={path('w.safetensors')}"]

        layouts = [(2, False), (4, False), (2, True), (4, True)]

        # 1. Loss and every gradient of one global batch.
        run([dump] + base + init + ["--output", path("g1.safetensors")], ranks=1)
        ref = read_safetensors(path("g1.safetensors"))
        for m, sp in layouts:
            name = f"M={m}{' +SP' if sp else ''}"
            out = path(f"g{m}{sp}.safetensors")
            run([dump] + base + init + ["--set", f"parallel.tensor={m}", "--set",
                                        f"parallel.sequence_parallel={'true' if sp else 'false'}",
                                        "--output", out], ranks=m)
            got = read_safetensors(out)
            check(sorted(got) == sorted(ref), f"{name}: the same {len(ref)} tensors")
            worst = worst_tensor_diff(got, ref)
            check(worst[0] <= 1e-5, f"{name}: loss and gradients within 1e-5 (worst {worst[0]:.2e}, {worst[1]})")

        # 2. Ten steps of training, with and without dropout.
        for dropout in ("0.0", "0.1"):
            common = base + init + ["--set", f"model.dropout={dropout}"]
            run([trident, "train"] + common + ["--set", f"logging.metrics={path('m1.jsonl')}"], ranks=1)
            ref_curve = [r["loss"] for r in losses(path("m1.jsonl"))]
            for m, sp in layouts:
                if dropout != "0.0" and m == 4 and not sp:
                    continue
                name = f"M={m}{' +SP' if sp else ''} dropout {dropout}"
                metrics = path(f"m{m}{sp}.jsonl")
                run([trident, "train"] + common + [
                    "--set", f"parallel.tensor={m}",
                    "--set", f"parallel.sequence_parallel={'true' if sp else 'false'}",
                    "--set", f"logging.metrics={metrics}"], ranks=m)
                rows = losses(metrics)
                curve = [r["loss"] for r in rows]
                worst = max(abs(x - y) / abs(y) for x, y in zip(curve, ref_curve))
                check(len(curve) == 10 and worst <= 1e-5,
                      f"{name}: 10-step losses within 1e-5 of M=1 (worst {worst:.2e})")

                # 3. Traffic per step: Megatron's 4 all-reduces of (b·s·h) per layer per
                # microbatch, plus the embedding's and the LM head's, plus the loss's 3 numbers
                # per token; with sequence parallelism all-gathers and reduce-scatters instead.
                if dropout != "0.0":
                    continue
                N, C, L, accum = 2 * 16, 32, 2, 2
                R = N // m
                if not sp:
                    elements = {"all_reduce": accum * ((4 * L + 2) * N * C + 3 * N) + 2,
                                "all_gather": 0, "reduce_scatter": 0}
                else:
                    elements = {"all_reduce": accum * 3 * N + 2 + (4 * L + 2) * C,
                                "all_gather": accum * (4 * L + 2) * R * C,
                                "reduce_scatter": accum * (4 * L + 2) * N * C}
                expect = {f"tp_{kind}_bytes": 4 * n for kind, n in elements.items()}
                for key, value in expect.items():
                    seen = {r.get(key) for r in rows}
                    check(seen == {value}, f"{name}: {key} per step = {value} (seen {sorted(seen)})")

        # 4. The trained model exports whole from any split: the same weights as M = 1. (A
        # small learning rate: Adam divides each gradient by its own magnitude, which turns
        # rounding in near-zero gradients into visible weight differences; the losses above
        # are the contract, this checks that the slices are gathered into their places.)
        exported = {}
        for m, sp in [(1, False), (2, False), (4, True)]:
            ck = path(f"ck{m}{sp}")
            run([trident, "train"] + base + init + [
                "--set", "training.lr=1e-6", "--set", "training.min_lr=1e-7",
                "--set", f"parallel.tensor={m}",
                "--set", f"parallel.sequence_parallel={'true' if sp else 'false'}",
                "--set", f"checkpoint.dir={ck}"], ranks=m)
            run([trident, "export", "--checkpoint", ck, "--output", ck + ".safetensors"])
            exported[(m, sp)] = read_safetensors(ck + ".safetensors")
        ref_weights = exported[(1, False)]
        for key, got in exported.items():
            worst = worst_tensor_diff(got, ref_weights)
            check(worst[0] <= 1e-5, f"M={key[0]}{' +SP' if key[1] else ''}: exported weights after"
                                    f" 10 steps within 1e-5 of M=1 (worst {worst[0]:.2e}, {worst[1]})")

        # 5. Bad grids: one message, every rank exits non-zero, no hang.
        p = run([trident, "train"] + base + ["--set", "parallel.tensor=3"], ranks=3, expect_ok=False)
        check(p.returncode != 0 and p.stdout.count("trident: error") == 1
              and "must divide model.heads" in p.stdout,
              f"heads not divisible by M: one message, exit {p.returncode}")
        p = run([trident, "train"] + base + ["--set", "parallel.tensor=4"], ranks=2, expect_ok=False)
        check(p.returncode != 0 and p.stdout.count("trident: error") == 1
              and "2 processes were started" in p.stdout,
              f"world size != P·M·D: one message, exit {p.returncode}")
        p = run([trident, "train"] + base + ["--set", "parallel.tensor=2", "--set",
                                             f"data.train={path('missing.bin')}"],
                ranks=2, expect_ok=False)
        check(p.returncode != 0 and p.stdout.count("trident: error") == 1 and "missing.bin" in p.stdout,
              f"a missing data file: one message, exit {p.returncode}")

    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
