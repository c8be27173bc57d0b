#!/usr/bin/python3
"""PyTorch doing the same training step as `trident bench --config configs/bench-cpu.yaml`.

The GPT-2 of scripts/torch_gpt2.py (explicit attention, fp32) of the benchmark's shape, or with
--arch llama the Llama of scripts/torch_llama.py (--kv-heads, --ffn its SwiGLU width; with
--experts N a mixture of experts in every layer, --top-k, --shared), trained with
torch.optim.AdamW and clip_grad_norm_ on random tokens; prints one JSON line with tokens_per_s,
the median over the timed steps. Run with Debian's python3 (python3-torch).
"""
import argparse
import json
import statistics
import time

import torch

from torch_gpt2 import Gpt  # beside this script
from torch_llama import Llama


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--ffn", type=int, default=1536)
    p.add_argument("--arch", choices=["gpt2", "llama"], default="gpt2")
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--experts", type=int, default=0, help="llama: experts per layer (0: dense)")
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--shared", type=int, default=0, help="llama: shared experts of width --ffn")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if a.arch == "llama":
        moe = (a.experts, a.top_k, a.shared) if a.experts else None
        model = Llama(a.vocab, a.seq, a.layers, a.hidden, a.heads, a.kv_heads, a.ffn, moe=moe)
    else:
        model = Gpt(a.vocab, a.seq, a.layers, a.hidden, a.heads, a.ffn)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    times = []
    for step in range(a.warmup + a.steps):
        idx = torch.randint(0, a.vocab, (a.batch, a.seq + 1))
        t0 = time.perf_counter()
        loss = model(idx[:, :-1], idx[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if step >= a.warmup:
            times.append(dt)
        print(f"step {step + 1} | loss {loss.item():.4f} | {1e3 * dt:.0f} ms", flush=True)
    step_s = statistics.median(times)
    print(json.dumps({"tokens_per_s": a.batch * a.seq / step_s, "step_ms": 1e3 * step_s,
                      "torch": torch.__version__, "threads": a.threads}))


if __name__ == "__main__":
    main()
