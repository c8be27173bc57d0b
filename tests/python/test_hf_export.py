#!/usr/bin/python3
"""`trident export` writes what Hugging Face's transformers loads: model.safetensors and, beside
it, config.json, a GPT2Config.

Debian has no python3-transformers and this machine reaches no other package index, so
from_pretrained itself cannot run here. In its place:
  1. config.json holds exactly GPT2Config's arguments (transformers'
     models/gpt2/configuration_gpt2.py, listed below) plus model_type "gpt2" and architectures
     ["GPT2LMHeadModel"], which AutoConfig and from_pretrained read; its values are the
     run's model (n_head among them: the weights' shapes do not tell it) and GPT-2's own
     (gelu_new, layer norm epsilon 1e-5);
  2. the independent PyTorch GPT-2 of gpt2_reference.py, built from config.json alone, with
     the safetensors' tensors under GPT2LMHeadModel's names ("transformer.h.0.attn.c_attn.weight",
     every one of its parameters, none left over), gives the run's last validation loss
     within 1e-5 relative.

Exit status: 0 passed, 1 a check failed, 77 skipped (no torch or numpy).
"""
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
import gpt2_reference as ref  # noqa: E402

# GPT2Config.__init__'s arguments (transformers' configuration_gpt2.py).
GPT2_CONFIG_ARGUMENTS = {
    "vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner",
    "activation_function", "resid_pdrop", "embd_pdrop", "attn_pdrop", "layer_norm_epsilon",
    "initializer_range", "summary_type", "summary_use_proj", "summary_activation",
    "summary_proj_to_labels", "summary_first_dropout", "scale_attn_weights", "use_cache",
    "bos_token_id", "eos_token_id", "scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn",
}
# What PretrainedConfig and from_pretrained read beside them.
LOADER_FIELDS = {"model_type", "architectures"}

# Heads 8 wide (hidden 32 / 4 heads), which no GPT-2 size has: only config.json tells them.
SHAPE = ref.GPTShape(vocab=300, seq_len=16, layers=2, hidden=32, heads=4, ffn=128)
EVAL_SEQUENCES = 8

failures = []


def check(name, ok, detail):
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)
    if not ok:
        failures.append(name)


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        print(p.stdout)
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}")
    return p.stdout


def reference_from_export(directory):
    """The reference GPT-2 built from DIR/config.json, loaded with DIR/model.safetensors as
    GPT2LMHeadModel names them; and the names it found no place for."""
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    shape = ref.GPTShape(vocab=config["vocab_size"], seq_len=config["n_positions"],
                         layers=config["n_layer"], hidden=config["n_embd"],
                         heads=config["n_head"], ffn=config["n_inner"])
    model = ref.GPT2Reference(shape)
    tensors, _ = ref.read_safetensors(os.path.join(directory, "model.safetensors"))
    params = dict(model.named_parameters())
    unused = []
    with torch.no_grad():
        for name, array in tensors.items():
            ours = name[len("transformer."):] if name.startswith("transformer.") else None
            if ours not in params or tuple(params[ours].shape) != array.shape:
                unused.append(name)
                continue
            params[ours].copy_(torch.tensor(array, dtype=torch.float64))
            del params[ours]
    return config, model, unused, sorted(params)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--trident", required=True)
    parser.add_argument("--tools-dir")
    a = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = lambda name: os.path.join(tmp, name)  # noqa: E731
        rng = np.random.default_rng(11)
        ref.write_llmc_shard(path("train.bin"), rng.integers(0, SHAPE.vocab, size=3000))
        valid_tokens = rng.integers(0, SHAPE.vocab, size=1000)
        ref.write_llmc_shard(path("valid.bin"), valid_tokens)
        # Large weights, so that attention is far from uniform and its split into heads
        # shows in the loss (GPT-2's 0.02 leaves every head averaging alike).
        start = ref.GPT2Reference(SHAPE)
        ref.random_init(start, seed=3, std=0.3)
        ref.save_hf_weights(start, path("start.safetensors"), with_prefix=True)
        ref.write_config(path("c.yaml"), {
            "model": {"vocab_size": SHAPE.vocab, "seq_len": SHAPE.seq_len,
                      "layers": SHAPE.layers, "hidden": SHAPE.hidden, "heads": SHAPE.heads,
                      "ffn_hidden": SHAPE.ffn, "init_from": path("start.safetensors")},
            "training": {"micro_batch": 2, "global_batch": 4, "steps": 3, "warmup_steps": 1,
                         "lr": 1e-3, "threads": 1, "eval_sequences": EVAL_SEQUENCES},
            "data": {"train": path("train.bin"), "valid": path("valid.bin"), "shuffle": False},
            "checkpoint": {"dir": path("ck")},
            "device": "cpu"})
        run([a.trident, "train", "--config", path("c.yaml")])
        with open(path("ck/metrics.jsonl")) as f:
            val_loss = [json.loads(line) for line in f][-1]["val_loss"]
        out = run([a.trident, "export", "--checkpoint", path("ck"), "--output",
                   path("hf/model.safetensors")])
        check("export", f"-> {path('hf/model.safetensors')} and {path('hf/config.json')}" in out
              and "note:" not in out, out.strip())

        config, model, unused, missing = reference_from_export(path("hf"))
        check("config.json fields", set(config) == GPT2_CONFIG_ARGUMENTS | LOADER_FIELDS,
              f"extra {sorted(set(config) - GPT2_CONFIG_ARGUMENTS - LOADER_FIELDS)}, missing "
              f"{sorted((GPT2_CONFIG_ARGUMENTS | LOADER_FIELDS) - set(config))}")
        check("config.json values",
              config["model_type"] == "gpt2" and config["architectures"] == ["GPT2LMHeadModel"]
              and (config["vocab_size"], config["n_positions"], config["n_layer"],
                   config["n_embd"], config["n_head"], config["n_inner"])
              == (SHAPE.vocab, SHAPE.seq_len, SHAPE.layers, SHAPE.hidden, SHAPE.heads, SHAPE.ffn)
              and config["activation_function"] == "gelu_new"
              and config["layer_norm_epsilon"] == 1e-5
              and config["resid_pdrop"] == config["embd_pdrop"] == config["attn_pdrop"] == 0,
              json.dumps(config))
        check("tensors", not unused and not missing,
              f"no place for {unused}; not in the file: {missing}")

        inputs, targets = [], []
        for k in range(EVAL_SEQUENCES):
            x, y = ref.sample_window(valid_tokens.astype(np.int64), k, SHAPE.seq_len)
            inputs.append(x)
            targets.append(y)
        with torch.no_grad():
            loss = model.loss(torch.tensor(np.stack(inputs)), torch.tensor(np.stack(targets)))
        error = abs(float(loss) - val_loss) / val_loss
        check("loss", error <= 1e-5,
              f"the reference from config.json + model.safetensors: {float(loss):.6f} on "
              f"samples 0..{EVAL_SEQUENCES - 1} of data.valid, the run's last val_loss "
              f"{val_loss:.6f} (relative {error:.1e})")

    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
