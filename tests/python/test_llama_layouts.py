#!/usr/bin/python3
"""The llama model (model.arch: llama: RMSNorm, rotary positions, SwiGLU, grouped-query attention with
4 heads and 2 key/value heads, an untied head) on every layout family (layout_families.py), under
mpirun: the losses of 10 training steps match one process within 1e-5 relative (under context
parallelism each token rotated at its position in the whole sequence); bf16 and fp16 within 2% of
fp32; the loss and every gradient of one global batch match
for M = 2 and C = 2; a checkpoint exported as Hugging Face Llama safetensors holds its weights
bitwise and imports back to bitwise the same loss and gradients; a checkpoint written with M = 2
resumes with P = 2 on the same losses.
Needs only the standard library and mpirun; exit 77 (skipped) without mpirun.
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from layout_families import check_families, curve, sets, worst_rel  # noqa: E402
from mpi_harness import (binaries_or_skip, check, failures, read_safetensors, run,  # noqa: E402
                         tiny_run, worst_tensor_diff)

LLAMA = ["model.arch=llama", "model.layers=4", "model.kv_heads=2", "model.ffn_hidden=48",
         "model.rope_theta=500000"]

PRECISIONS = [
    ("bf16", 1, ["training.precision=bf16"]),
    ("fp16", 1, ["training.precision=fp16"]),
    ("bf16 M=2 P=2", 4, ["training.precision=bf16", "parallel.tensor=2", "parallel.pipeline=2"]),
]


def main():
    trident, dump = binaries_or_skip()
    with tempfile.TemporaryDirectory() as tmp:
        path = lambda name: os.path.join(tmp, name)  # noqa: E731
        base = tiny_run(tmp, LLAMA)
        # One process: the reference curve, and a checkpoint at step 5 to start the gradients
        # from non-trivial weights.
        run([trident, "train"] + base + sets([f"logging.metrics={path('m1.jsonl')}",
                                              f"checkpoint.dir={path('ck1')}",
                                              "checkpoint.interval=5"]), ranks=1)
        reference = curve(path("m1.jsonl"))
        check(len(reference) == 10, f"one process: 10 steps ({len(reference)})")
        check_families(trident, base, tmp, "llama", reference)
        # 16-bit storage with fp32 compute: within 2% of the fp32 run at every step, as
        # tests/python/test_mixed_precision.py holds GPT-2.
        for name, ranks, overrides in PRECISIONS:
            metrics = path(f"p_{name.replace(' ', '_').replace('=', '')}.jsonl")
            run([trident, "train"] + base + sets(overrides + [f"logging.metrics={metrics}"]),
                ranks=ranks)
            got = curve(metrics)
            worst = worst_rel(got, reference) if len(got) == 10 else float("inf")
            check(worst <= 0.02, f"{name}: 10-step losses within 2% of fp32 (worst {worst:.2e})")
        # The loss and every gradient of one global batch.
        init = sets([f"model.init_from={path('ck1/step_000005')}"])
        run([dump] + base + init + ["--output", path("g1.safetensors")], ranks=1)
        ref_grads = read_safetensors(path("g1.safetensors"))
        for name, ranks, overrides in [("M=2", 2, ["parallel.tensor=2"]),
                                       ("C=2 ring", 2, ["parallel.context=2"])]:
            out = path(f"g{ranks}{name[0]}.safetensors")
            run([dump] + base + init + sets(overrides) + ["--output", out], ranks=ranks)
            got = read_safetensors(out)
            worst = worst_tensor_diff(got, ref_grads)
            check(sorted(got) == sorted(ref_grads) and worst[0] <= 1e-5,
                  f"{name}: loss and {len(ref_grads) - 1} gradients within 1e-5 "
                  f"(worst {worst[0]:.2e}, {worst[1]})")
        # Export -> import: the Hugging Face Llama file holds the checkpoint's weights bit for
        # bit (the padded vocabulary rows dropped), and training from it gives the same loss
        # and gradients, bit for bit, as training from the checkpoint.
        run([trident, "export", "--checkpoint", path("ck1/step_000005"), "--output",
             path("hf.safetensors")])
        hf = read_safetensors(path("hf.safetensors"))
        shard = read_safetensors(path("ck1/step_000005/pp0_tp0_dp0.safetensors"))
        same = all(hf[n] == shard["param/" + (n if n.startswith("lm_head") else n[6:])][:len(hf[n])]
                   for n in hf)
        check(same and len(hf) == len(ref_grads) - 1,
              f"export: {len(hf)} Hugging Face tensors equal the checkpoint's, bitwise")
        run([dump] + base + sets([f"model.init_from={path('hf.safetensors')}"]) +
            ["--output", path("g_hf.safetensors")], ranks=1)
        check(read_safetensors(path("g_hf.safetensors")) == ref_grads,
              "import of the export: loss and gradients bitwise those from the checkpoint")
        # A checkpoint of M = 2 resumes with P = 2 on one process's losses.
        run([trident, "train"] + base + sets(["parallel.tensor=2", f"checkpoint.dir={path('ck2')}",
                                              "checkpoint.interval=5"]), ranks=2)
        shutil.rmtree(path("ck2/step_000010"))
        run([trident, "train"] + base + sets(["parallel.pipeline=2",
                                              f"checkpoint.dir={path('ck2')}",
                                              f"logging.metrics={path('resumed.jsonl')}"]),
            ranks=2)
        resumed = curve(path("resumed.jsonl"))
        worst = worst_rel(resumed, reference[5:]) if len(resumed) == 5 else float("inf")
        check(worst <= 1e-5, f"M=2 checkpoint resumed with P=2: steps 6-10 within 1e-5 "
                             f"(worst {worst:.2e})")
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
