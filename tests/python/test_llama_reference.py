# Proves Trident's llama model (model.arch: llama) against an independent float64 PyTorch
# Llama (llama_reference.py), itself first held against torch's own functions:
#   0. the reference's RMSNorm, rotary positions, grouped attention and SwiGLU against
#      F.normalize, torch.polar, F._scaled_dot_product_attention and F.silu (1e-12);
#   1. gradients: the loss and every parameter gradient of one global batch (two microbatches),
#      as trident_model_dump writes them under Hugging Face Llama's names, within 1e-5 relative
#      (max|a-b| / max|b| per tensor), with grouped-query attention (4 heads, 2 kv heads), an
#      untied head, rope_theta 500000 and norm_eps 1e-6;
#   2. training: ten AdamW steps of `trident train` against torch.optim.AdamW: loss 1e-5
#      relative, grad_norm 1e-4 relative.
#
# Run by ctest as: /usr/bin/python3 test_llama_reference.py --trident BIN --tools-dir DIR
# Exit status: 0 all checks passed, 1 a check failed, 77 skipped (torch or numpy missing).

import argparse
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"SKIP: the PyTorch reference needs torch and numpy ({e}); "
          f"install Debian's python3-torch and run with /usr/bin/python3")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference as common  # noqa: E402
import llama_reference as ref  # noqa: E402

TOLERANCE = 1e-5
GRAD_NORM_TOLERANCE = 1e-4
LAYER_TOLERANCE = 1e-12
SHAPE = ref.LlamaShape(vocab=100, seq_len=16, layers=2, hidden=32, heads=4, kv_heads=2, ffn=48,
                       rope_theta=500000.0, norm_eps=1e-6)
MICRO_BATCH, GLOBAL_BATCH = 2, 4
TRAINING = {"steps": 10, "lr": 5.0e-3, "min_lr": 5.0e-4, "warmup_steps": 3, "decay": "cosine",
            "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95, "eps": 1.0e-8, "grad_clip": 1.0,
            "seed": 7}

failures = []


def check(name, ok, detail):
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)
    if not ok:
        failures.append(name)


def config_sections(weights, shard, training, metrics=None):
    s = SHAPE
    return {
        "model": {"arch": "llama", "vocab_size": s.vocab, "seq_len": s.seq_len,
                  "layers": s.layers, "hidden": s.hidden, "heads": s.heads,
                  "kv_heads": s.kv_heads, "ffn_hidden": s.ffn, "rope_theta": s.rope_theta,
                  "norm_eps": s.norm_eps, "qk_norm": s.qk_norm, "head_dim": s.head_dim,
                  "init_from": weights},
        "training": {"micro_batch": MICRO_BATCH, "global_batch": GLOBAL_BATCH, "threads": 1,
                     **training},
        "data": {"train": shard, "valid": None, "shuffle": False},
        "logging": {"interval": 1, "metrics": metrics},
        "checkpoint": {"dir": None},
        "device": "cpu",
    }


def run(command, what):
    print("$ " + " ".join(command), flush=True)
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        check(what, False, f"exit status {done.returncode}\n{done.stdout[-3000:]}"
                           f"\n{done.stderr[-3000:]}")
        return None
    return done


def prepare(tmp, name, seed, token_count, training, metrics=None):
    """A reference model and its weights, tokens and config on disk."""
    model = ref.LlamaReference(SHAPE)
    ref.random_init(model, seed)
    tokens = np.random.default_rng(seed + 1).integers(0, SHAPE.vocab, size=token_count)
    weights, shard = os.path.join(tmp, f"{name}.safetensors"), os.path.join(tmp, f"{name}.bin")
    config = os.path.join(tmp, f"{name}.yaml")
    ref.save_hf_weights(model, weights)
    common.write_llmc_shard(shard, tokens)
    common.write_config(config, config_sections(weights, shard, training, metrics))
    return model, tokens, config


def test_layers():
    for name, error in ref.check_layers():
        check(name, error <= LAYER_TOLERANCE, f"max abs err {error:.2e}")


def test_gradients(tmp, dump_tool):
    model, tokens, config = prepare(tmp, "grads", 3, 1000, {"steps": 1, "seed": 3})
    output = os.path.join(tmp, "grads_out.safetensors")
    if run([dump_tool, "--config", config, "--output", output], "dump tool") is None:
        return
    inputs, targets = common.step_batch(tokens, 0, GLOBAL_BATCH, SHAPE.seq_len)
    loss = model.loss(inputs, targets)
    loss.backward()
    expected = {ref.hf_name(n): p.grad.numpy() for n, p in model.named_parameters()}
    expected["loss"] = np.array([loss.item()])
    dumped, _ = common.read_safetensors(output)
    check("dump names", set(dumped) == set(expected),
          f"missing {sorted(set(expected) - set(dumped))}, "
          f"unexpected {sorted(set(dumped) - set(expected))}")
    worst = 0.0
    for name, want in expected.items():
        error = common.relative_error(dumped.get(name, np.zeros(0)), want)
        worst = max(worst, error)
        check(name, error <= TOLERANCE, f"max rel err {error:.3e}")
    print(f"-- gradients: worst {worst:.3e}")


def test_training(tmp, trident):
    metrics = os.path.join(tmp, "metrics.jsonl")
    model, tokens, config = prepare(tmp, "train", 21, 400, TRAINING, metrics)
    if run([trident, "train", "--config", config], "trident train") is None:
        return
    with open(metrics) as f:
        records = [json.loads(line) for line in f if line.strip()]
    records = sorted((r for r in records if "loss" in r and "grad_norm" in r),
                     key=lambda r: r["step"])
    t = TRAINING
    optimizer = ref.make_adamw(model, t["lr"], t["beta1"], t["beta2"], t["eps"],
                               t["weight_decay"])
    check("steps", len(records) == t["steps"], f"{len(records)} metrics records")
    for step, record in enumerate(records):
        lr = common.lr_at(step, t["lr"], t["min_lr"], t["warmup_steps"], t["steps"], t["decay"])
        for group in optimizer.param_groups:
            group["lr"] = lr
        inputs, targets = common.step_batch(tokens, step, GLOBAL_BATCH, SHAPE.seq_len)
        optimizer.zero_grad(set_to_none=True)
        loss = model.loss(inputs, targets)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"]).item()
        optimizer.step()
        loss_error = abs(record["loss"] - loss.item()) / abs(loss.item())
        norm_error = abs(record["grad_norm"] - norm) / norm
        check(f"step {record['step']}", loss_error <= TOLERANCE and
              norm_error <= GRAD_NORM_TOLERANCE,
              f"loss {record['loss']:.8f} vs {loss.item():.8f} (rel {loss_error:.2e}), "
              f"grad_norm {record['grad_norm']:.6e} vs {norm:.6e} (rel {norm_error:.2e})")


def main():
    parser = argparse.ArgumentParser(description="Trident's llama against a float64 PyTorch Llama")
    parser.add_argument("--trident", required=True)
    parser.add_argument("--tools-dir", required=True)
    parser.add_argument("--keep", metavar="DIR")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.keep or scratch
        os.makedirs(tmp, exist_ok=True)
        test_layers()
        test_gradients(tmp, os.path.join(args.tools_dir, "trident_model_dump"))
        test_training(tmp, args.trident)
    if failures:
        print(f"FAILED {len(failures)} check(s): {', '.join(failures)}")
        return 1
    print("all llama reference checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
