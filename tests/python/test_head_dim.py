#!/usr/bin/python3
"""A llama whose heads are not hidden / heads wide (model.head_dim, Hugging Face's head_dim as
Qwen3's configs set it): 4 heads of 16 in a model 32 wide, so q_proj is 64 × 32 and o_proj
32 × 64, with Qwen3's q and k norms, against the float64 PyTorch Llama of llama_reference.py
given the same head_dim:
  1. the loss and every gradient of one global batch from trident_model_dump within 1e-5;
  2. ten AdamW steps of `trident train` against torch.optim.AdamW: loss 1e-5, grad_norm 1e-4;
  3. every layout family (layout_families.py), and M = 4 over 2 key/value heads (replicas):
     10-step losses within 1e-5 of one process;
  4. export to a Hugging Face folder: config.json's head_dim is 16, q_proj and o_proj have the
     attention's width and hold the checkpoint's weights bitwise, and a run whose shape comes
     from that folder's config.json alone trains from it.
Exit status: 0 passed, 1 a check failed, 77 skipped (torch, numpy or mpirun missing).

Run by ctest as: /usr/bin/python3 test_head_dim.py --trident BIN --tools-dir DIR
"""
import json
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
                                     qk_norm=True, head_dim=16)
WIDE = ["model.arch=llama", "model.kv_heads=2", "model.ffn_hidden=48", "model.qk_norm=true",
        "model.norm_eps=1e-6", "model.head_dim=16"]
REPLICAS = [("M=4 over 2 kv heads", 4, ["parallel.tensor=4"])]


def test_export(trident, tmp, base):
    ck = os.path.join(tmp, "ck")
    run([trident, "train"] + base + sets([f"checkpoint.dir={ck}", "training.steps=2"]), ranks=1)
    folder = os.path.join(tmp, "hf")
    run([trident, "export", "--checkpoint", os.path.join(ck, "step_000002"), "--format", "hf",
         "--output", folder])
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    check(config.get("head_dim") == 16 and config.get("hidden_size") == 32,
          f"export: config.json's head_dim {config.get('head_dim')}, hidden_size "
          f"{config.get('hidden_size')}")
    hf = read_safetensors(os.path.join(folder, "model.safetensors"))
    shard = read_safetensors(os.path.join(ck, "step_000002", "pp0_tp0_dp0.safetensors"))
    names = [f"model.layers.{l}.self_attn.{w}_proj.weight" for l in range(2) for w in "qkvo"]
    same = all(n in hf and hf[n] == shard["param/" + n[6:]] for n in names)
    check(same, f"export: {len(names)} attention tensors under Hugging Face's names, bitwise")
    # The shape from the folder's config.json alone (head_dim 16 read into model.head_dim).
    config_path = os.path.join(tmp, "from_hf.yaml")
    with open(config_path, "w") as f:
        f.write(f"model: {{arch: llama, init_from: {folder}}}\n"
                "training: {micro_batch: 2, global_batch: 4, steps: 1, threads: 1}\n"
                f"data: {{train: {os.path.join(tmp, 'train.bin')}, shuffle: false}}\n")
    p = run([trident, "train", "--config", config_path], ranks=1, expect_ok=False)
    check(p.returncode == 0 and "step     1/1" in p.stdout,
          f"a run from the folder's config.json trains: {p.stdout.strip()[-300:]}")


def main():
    trident, dump = binaries_or_skip()
    single.torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        single.test_gradients(tmp, dump)
        single.test_training(tmp, trident)
        base = tiny_run(tmp, WIDE)
        check_families(trident, base, tmp, "head_dim", families=FAMILIES + REPLICAS)
        test_export(trident, tmp, base)
    failed = single.failures + failures
    print(f"{len(failed)} failed" if failed else "all passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
