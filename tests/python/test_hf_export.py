#!/usr/bin/python3
"""`trident export` writes what Hugging Face's transformers loads: model.safetensors and, beside
it, config.json, a GPT2Config; and with --format hf a Llama folder, config.json (a LlamaConfig)
with the weights in shards and their index.

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
     within 1e-5 relative;
  3. for llama, config.json holds exactly LlamaConfig's arguments (transformers'
     models/llama/configuration_llama.py) plus model_type, architectures and torch_dtype; the
     index is save_pretrained's (metadata.total_size, a weight_map naming each tensor's shard,
     shards model-0000i-of-0000n.safetensors); the tensors are LlamaForCausalLM's names, shapes
     ([out, in] projections, unpadded vocabulary) and dtype (F32, as torch_dtype says); and the
     independent PyTorch Llama of llama_reference.py built from config.json alone, loaded with
     them, gives the run's last validation loss within 1e-5 relative.

Exit status: 0 passed, 1 a check failed, 77 skipped (no torch or numpy).
"""
import argparse
import json
import os
import struct
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
import llama_reference as llama  # noqa: E402

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

# LlamaConfig.__init__'s arguments (transformers' configuration_llama.py).
LLAMA_CONFIG_ARGUMENTS = {
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "hidden_act", "max_position_embeddings", "initializer_range",
    "rms_norm_eps", "use_cache", "pad_token_id", "bos_token_id", "eos_token_id", "pretraining_tp",
    "tie_word_embeddings", "rope_theta", "rope_scaling", "attention_bias", "attention_dropout",
    "mlp_bias", "head_dim",
}
LLAMA_SHAPE = llama.LlamaShape(vocab=300, seq_len=16, layers=2, hidden=32, heads=4, kv_heads=2,
                               ffn=48, rope_theta=500000.0, norm_eps=1e-6)

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


def train_and_export(trident, path, name, model, init_from, export_args):
    """Trains `model` (config keys) 3 steps from `init_from`; returns the last val_loss and
    the export's output."""
    ref.write_config(path(f"{name}.yaml"), {
        "model": dict(model, init_from=init_from),
        "training": {"micro_batch": 2, "global_batch": 4, "steps": 3, "warmup_steps": 1,
                     "lr": 1e-3, "threads": 1, "eval_sequences": EVAL_SEQUENCES},
        "data": {"train": path("train.bin"), "valid": path("valid.bin"), "shuffle": False},
        "checkpoint": {"dir": path(f"{name}_ck")},
        "device": "cpu"})
    run([trident, "train", "--config", path(f"{name}.yaml")])
    with open(path(f"{name}_ck/metrics.jsonl")) as f:
        val_loss = [json.loads(line) for line in f][-1]["val_loss"]
    return val_loss, run([trident, "export", "--checkpoint", path(f"{name}_ck")] + export_args)


def check_loss(name, model, valid_tokens, seq_len, val_loss):
    inputs, targets = [], []
    for k in range(EVAL_SEQUENCES):
        x, y = ref.sample_window(valid_tokens.astype(np.int64), k, seq_len)
        inputs.append(x)
        targets.append(y)
    with torch.no_grad():
        loss = model.loss(torch.tensor(np.stack(inputs)), torch.tensor(np.stack(targets)))
    error = abs(float(loss) - val_loss) / val_loss
    check(name, error <= 1e-5,
          f"the reference from the export: {float(loss):.6f} on samples "
          f"0..{EVAL_SEQUENCES - 1} of data.valid, the run's last val_loss {val_loss:.6f} "
          f"(relative {error:.1e})")


def check_gpt2(trident, path, valid_tokens):
    # Large weights, so that attention is far from uniform and its split into heads
    # shows in the loss (GPT-2's 0.02 leaves every head averaging alike).
    start = ref.GPT2Reference(SHAPE)
    ref.random_init(start, seed=3, std=0.3)
    ref.save_hf_weights(start, path("start.safetensors"), with_prefix=True)
    model = {"vocab_size": SHAPE.vocab, "seq_len": SHAPE.seq_len, "layers": SHAPE.layers,
             "hidden": SHAPE.hidden, "heads": SHAPE.heads, "ffn_hidden": SHAPE.ffn}
    val_loss, out = train_and_export(trident, path, "gpt2", model, path("start.safetensors"),
                                     ["--output", path("hf/model.safetensors")])
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
    check_loss("loss", model, valid_tokens, SHAPE.seq_len, val_loss)


def llama_layout(s):
    """LlamaForCausalLM's state dict for shape `s`: name -> shape ([out, in] projections)."""
    d, F = s.hidden // s.heads, s.ffn
    names = {"model.embed_tokens.weight": (s.vocab, s.hidden), "model.norm.weight": (s.hidden,),
             "lm_head.weight": (s.vocab, s.hidden)}
    for i in range(s.layers):
        p = f"model.layers.{i}."
        names.update({
            p + "input_layernorm.weight": (s.hidden,),
            p + "post_attention_layernorm.weight": (s.hidden,),
            p + "self_attn.q_proj.weight": (s.heads * d, s.hidden),
            p + "self_attn.k_proj.weight": (s.kv_heads * d, s.hidden),
            p + "self_attn.v_proj.weight": (s.kv_heads * d, s.hidden),
            p + "self_attn.o_proj.weight": (s.hidden, s.heads * d),
            p + "mlp.gate_proj.weight": (F, s.hidden), p + "mlp.up_proj.weight": (F, s.hidden),
            p + "mlp.down_proj.weight": (s.hidden, F)})
    return names


def header_dtypes(file):
    """{tensor name: dtype} from a safetensors header."""
    with open(file, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return {name: info["dtype"] for name, info in header.items()}


def read_llama_folder(directory):
    """config.json, the index, and every tensor of the shards with its dtype and shard."""
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(directory, "model.safetensors.index.json")) as f:
        index = json.load(f)
    tensors, dtypes, shard_of = {}, {}, {}
    for shard in sorted(set(index["weight_map"].values())):
        file = os.path.join(directory, shard)
        found, _ = ref.read_safetensors(file)
        tensors.update(found)
        dtypes.update(header_dtypes(file))
        shard_of.update({name: shard for name in found})
    return config, index, tensors, dtypes, shard_of


def check_llama(trident, path, valid_tokens):
    s = LLAMA_SHAPE
    start = llama.LlamaReference(s)
    llama.random_init(start, seed=4, std=0.3)
    llama.save_hf_weights(start, path("llama_start.safetensors"))
    model = {"arch": "llama", "vocab_size": s.vocab, "seq_len": s.seq_len, "layers": s.layers,
             "hidden": s.hidden, "heads": s.heads, "kv_heads": s.kv_heads, "ffn_hidden": s.ffn,
             "rope_theta": s.rope_theta, "norm_eps": s.norm_eps}
    # 40 KB shards: the 38.4 KB embedding and LM head alone, the layers in several.
    val_loss, out = train_and_export(trident, path, "llama", model,
                                     path("llama_start.safetensors"),
                                     ["--format", "hf", "--shard-size", "40000", "--output",
                                      path("llama_hf")])
    config, index, tensors, dtypes, shard_of = read_llama_folder(path("llama_hf"))
    expected = LLAMA_CONFIG_ARGUMENTS | LOADER_FIELDS | {"torch_dtype"}
    check("llama config.json fields", set(config) == expected,
          f"extra {sorted(set(config) - expected)}, missing {sorted(expected - set(config))}")
    ours = (s.vocab, s.hidden, s.ffn, s.layers, s.heads, s.kv_heads, s.hidden // s.heads,
            s.seq_len, s.rope_theta, s.norm_eps, False, "silu", None, False, False, "float32")
    theirs = tuple(config.get(k) for k in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
        "rope_theta", "rms_norm_eps", "tie_word_embeddings", "hidden_act", "rope_scaling",
        "attention_bias", "mlp_bias", "torch_dtype"))
    check("llama config.json values", ours == theirs and config["model_type"] == "llama"
          and config["architectures"] == ["LlamaForCausalLM"], json.dumps(config))
    shards = sorted(set(index["weight_map"].values()))
    n = len(shards)
    check("llama index", n > 2 and shards == [f"model-{i:05d}-of-{n:05d}.safetensors"
                                              for i in range(1, n + 1)]
          and index["weight_map"] == shard_of
          and index["metadata"]["total_size"] == sum(t.nbytes for t in tensors.values())
          and not os.path.exists(path("llama_hf/model.safetensors")),
          f"{n} shards, total_size {index['metadata']['total_size']}; {out.strip()}")
    layout = {name: tuple(t.shape) for name, t in tensors.items()}
    check("llama tensors", layout == llama_layout(s)
          and set(dtypes.values()) == {"F32"},
          f"names and shapes {'==' if layout == llama_layout(s) else '!='} LlamaForCausalLM's, "
          f"dtypes {sorted(set(dtypes.values()))}")

    reference = llama.LlamaReference(llama.LlamaShape(
        vocab=config["vocab_size"], seq_len=config["max_position_embeddings"],
        layers=config["num_hidden_layers"], hidden=config["hidden_size"],
        heads=config["num_attention_heads"], kv_heads=config["num_key_value_heads"],
        ffn=config["intermediate_size"], tied=config["tie_word_embeddings"],
        rope_theta=config["rope_theta"], norm_eps=config["rms_norm_eps"]))
    with torch.no_grad():
        for name, p in reference.named_parameters():
            p.copy_(torch.tensor(tensors[llama.hf_name(name)], dtype=torch.float64))
    check_loss("llama loss", reference, valid_tokens, s.seq_len, val_loss)


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
        check_gpt2(a.trident, path, valid_tokens)
        check_llama(a.trident, path, valid_tokens)

    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
