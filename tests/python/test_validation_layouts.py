#!/usr/bin/python3
"""Validation is the same on every layout, under mpirun.

training.eval_sequences counts sequences of data.valid (samples 0 .. N-1), which each
replica evaluates its share of in microbatches; so the micro batch, D, P, M and C all give one
process's validation losses: before training (step 0 of the metrics file) and after steps 2
and 4, within 1e-5 relative, as the training losses. The same weights evaluated on
microbatches of 1 and of 8 sequences give one loss. The old key training.eval_batches is read
as its sequences (eval_batches x micro_batch), with one warning.

Needs only the standard library and mpirun; exit 77 (skipped) without mpirun.
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_harness import (binaries_or_skip, check, failures, losses, run, tiny_run,  # noqa: E402
                         write_shard)

# (P, M, C, D, micro batch): every way of splitting a global batch of 8 on up to 4 ranks.
LAYOUTS = [(1, 1, 1, 1, 1), (1, 1, 1, 1, 2), (1, 1, 1, 2, 2), (1, 1, 1, 4, 1), (2, 1, 1, 1, 2),
           (1, 2, 1, 1, 4), (1, 1, 2, 1, 4), (2, 1, 1, 2, 1)]


def validations(metrics):
    """{step: val_loss} of a metrics file."""
    with open(metrics) as f:
        rows = [json.loads(line) for line in f]
    return {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}


def main():
    trident, _ = binaries_or_skip()
    with tempfile.TemporaryDirectory() as tmp:
        path = lambda name: os.path.join(tmp, name)  # noqa: E731
        valid = path("valid.bin")
        write_shard(valid, [(i * 131 + (i * i) % 53) % 300 for i in range(2000)])
        common = ["training.global_batch=8", "training.steps=4", f"data.valid={valid}",
                  "training.eval_interval=2"]
        base = tiny_run(tmp, common + ["training.eval_sequences=16"])
        ref_metrics = path("ref.jsonl")
        run([trident, "train"] + base + ["--set", "training.micro_batch=8",
                                         "--set", f"logging.metrics={ref_metrics}"])
        ref, ref_train = validations(ref_metrics), losses(ref_metrics)
        check(sorted(ref) == [0, 2, 4], f"1x1x1x1: validated at steps 0, 2, 4 ({sorted(ref)})")

        for p, m, c, d, mb in LAYOUTS:
            name = f"{p}x{m}x{c}x{d} micro batch {mb}"
            metrics = path("m.jsonl")
            run([trident, "train"] + base + [
                "--set", f"parallel.pipeline={p}", "--set", f"parallel.tensor={m}",
                "--set", f"parallel.context={c}", "--set", f"parallel.data={d}",
                "--set", f"training.micro_batch={mb}", "--set", f"logging.metrics={metrics}"],
                ranks=p * m * c * d)
            got = validations(metrics)
            worst = max((abs(got[s] - ref[s]) / abs(ref[s]) for s in ref if s in got),
                        default=float("inf"))
            train = max(abs(x["loss"] - y["loss"]) / abs(y["loss"])
                        for x, y in zip(losses(metrics), ref_train))
            check(sorted(got) == sorted(ref) and worst <= 1e-5 and train <= 1e-5,
                  f"{name}: validation losses at steps {sorted(got)} within 1e-5 of 1x1x1x1 "
                  f"micro batch 8 (worst {worst:.2e}; training {train:.2e})")

        # The old key: 2 microbatches of 8 are the same 16 sequences, said once.
        metrics = path("old.jsonl")
        p = run([trident, "train"] + tiny_run(tmp, common) + [
            "--set", "training.eval_batches=2", "--set", "training.micro_batch=8",
            "--set", f"logging.metrics={metrics}"])
        check(p.stdout.count("training.eval_batches is deprecated") == 1
              and "read as training.eval_sequences = 2 x micro_batch 8 = 16" in p.stdout,
              "training.eval_batches: one warning saying what it is read as")
        check(validations(metrics) == ref, "training.eval_batches: the same validation losses")

    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
