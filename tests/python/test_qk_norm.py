#!/usr/bin/python3
"""Qwen3's query and key norms (model.qk_norm: true on model.arch: llama, the attention kind
"grouped_qk_norm"; model/qk_norm.h) against the float64 PyTorch Llama of llama_reference.py with
its q_norm and k_norm (an RMSNorm of each query and key head before rotary, as Hugging Face's
Qwen3Attention):
  1. the loss and every gradient of one global batch, q_norm.weight and k_norm.weight included,
     from trident_model_dump within 1e-5 relative;
  2. ten AdamW steps of `trident train` against torch.optim.AdamW: loss 1e-5, grad_norm 1e-4;
  3. every layout family (layout_families.py), and M = 4 over 2 key/value heads (replicas):
     10-step losses within 1e-5 of one process;
  4. export -> import: the Hugging Face names (model.layers.N.self_attn.q_norm.weight) hold the
     checkpoint's weights bitwise.
Exit status: 0 passed, 1 a check failed, 77 skipped (torch, numpy or mpirun missing).

Run by ctest as: /usr/bin/python3 test_qk_norm.py --trident BIN --tools-dir DIR
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_llama_reference as single  # noqa: E402  (exits 77 without torch)
from layout_families import FAMILIES, check_families, sets  # noqa: E402
from mpi_harness import (binaries_or_skip, check, failures, read_safetensors, run,  # noqa: E402
                         tiny_run)

single.SHAPE = single.ref.LlamaShape(vocab=100, seq_len=16, layers=2, hidden=32, heads=4,
                                     kv_heads=2, ffn=48, rope_theta=500000.0, norm_eps=1e-6,
                                     qk_norm=True)
QWEN = ["model.arch=llama", "model.kv_heads=2", "model.ffn_hidden=48", "model.qk_norm=true",
        "model.norm_eps=1e-6"]
REPLICAS = [("M=4 over 2 kv heads", 4, ["parallel.tensor=4"])]


def test_export(trident, tmp, base):
    ck = os.path.join(tmp, "ck")
    run([trident, "train"] + base + sets([f"checkpoint.dir={ck}", "training.steps=2"]), ranks=1)
    out = os.path.join(tmp, "hf.safetensors")
    run([trident, "export", "--checkpoint", os.path.join(ck, "step_000002"), "--output", out])
    hf = read_safetensors(out)
    shard = read_safetensors(os.path.join(ck, "step_000002", "pp0_tp0_dp0.safetensors"))
    names = [f"model.layers.{l}.self_attn.{w}_norm.weight" for l in range(2) for w in "qk"]
    same = all(n in hf and hf[n] == shard["param/" + n[6:]] for n in names)
    check(same, f"export: {len(names)} q_norm/k_norm tensors under Hugging Face's names, bitwise")


def main():
    trident, dump = binaries_or_skip()
    single.torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        single.test_gradients(tmp, dump)
        single.test_training(tmp, trident)
        base = tiny_run(tmp, QWEN)
        check_families(trident, base, tmp, "qk_norm", families=FAMILIES + REPLICAS)
        test_export(trident, tmp, base)
    failed = single.failures + failures
    print(f"{len(failed)} failed" if failed else "all passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
