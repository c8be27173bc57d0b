# Trident's greedy continuation of a small llama (grouped-query attention: 4 heads, 2 key/value
# heads) against the float64 reference's (llama_reference.py) on the same weights: `trident
# generate --temperature 0` over its key/value cache must give the reference's tokens, each
# chosen by a full rerun of the reference over the context window, through the window's slide
# when the cache is full (generation keeps the last seq_len / 2 tokens and goes on, see
# src/train/generator.h).
#
# The weights reach `trident generate` as a checkpoint of `trident train` with init_from the
# reference's file and a learning rate of 1e-30, whose one step leaves every fp32 weight as
# it was (an update below half a unit in the last place).
#
# Run by ctest as: /usr/bin/python3 test_llama_generate.py --trident BIN --tools-dir DIR
# Exit status: 0 passed, 1 failed, 77 skipped (torch or numpy missing).

import argparse
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

SHAPE = ref.LlamaShape(vocab=256, seq_len=16, layers=2, hidden=32, heads=4, kv_heads=2, ffn=48,
                       rope_theta=500000.0, norm_eps=1e-6)
PROMPT = b"And God"
TOKENS = 30  # past seq_len: the window slides twice


def reference_greedy(model, prompt, count):
    """The reference's greedy tokens, each from a rerun over generation's window."""
    T = SHAPE.seq_len
    context, window, out, margins = list(prompt), list(prompt), [], []
    for _ in range(count):
        with torch.no_grad():
            logits = model.logits(torch.tensor([window]))[0, -1]
        top2 = torch.topk(logits, 2).values
        margins.append((top2[0] - top2[1]).item())
        token = int(torch.argmax(logits))
        context.append(token)
        out.append(token)
        window = window + [token] if len(window) < T else context[-(T // 2):]
    return out, min(margins)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--trident", required=True)
    parser.add_argument("--tools-dir", required=True)
    args = parser.parse_args()
    model = ref.LlamaReference(SHAPE)
    ref.random_init(model, 17, std=0.5)
    with tempfile.TemporaryDirectory() as tmp:
        weights, shard = os.path.join(tmp, "w.safetensors"), os.path.join(tmp, "t.bin")
        config, run_dir = os.path.join(tmp, "c.yaml"), os.path.join(tmp, "run")
        ref.save_hf_weights(model, weights)
        common.write_llmc_shard(shard, np.arange(400) % SHAPE.vocab)
        s = SHAPE
        common.write_config(config, {
            "model": {"arch": "llama", "vocab_size": s.vocab, "seq_len": s.seq_len,
                      "layers": s.layers, "hidden": s.hidden, "heads": s.heads,
                      "kv_heads": s.kv_heads, "ffn_hidden": s.ffn, "rope_theta": s.rope_theta,
                      "norm_eps": s.norm_eps, "init_from": weights},
            "training": {"micro_batch": 1, "global_batch": 1, "steps": 1, "lr": 1.0e-30,
                         "min_lr": 0.0, "warmup_steps": 0, "threads": 1},
            "data": {"train": shard, "valid": None},
            "checkpoint": {"dir": run_dir},
            "device": "cpu",
        })
        for command in ([args.trident, "train", "--config", config],
                        [args.trident, "generate", "--checkpoint", run_dir, "--prompt",
                         PROMPT.decode(), "--tokens", str(TOKENS), "--temperature", "0"]):
            print("$ " + " ".join(command), flush=True)
            done = subprocess.run(command, capture_output=True, timeout=600)
            if done.returncode != 0:
                print(f"FAIL  exit status {done.returncode}\n{done.stderr.decode()[-3000:]}")
                return 1
    text = done.stdout
    got = list(text[len(PROMPT):-1])  # the prompt, the bytes generated, a newline
    want, margin = reference_greedy(model, list(PROMPT), TOKENS)
    print(f"trident   {got}\nreference {want}\n(smallest gap between the reference's two "
          f"likeliest tokens: {margin:.3e})")
    ok = text.startswith(PROMPT) and text.endswith(b"\n") and got == want
    print(f"{'PASS' if ok else 'FAIL'}  greedy continuation of {TOKENS} tokens")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
