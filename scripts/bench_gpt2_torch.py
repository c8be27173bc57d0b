#!/usr/bin/env python3
"""PyTorch's GPT-2 training step on a GPU, the reference scripts/bench_gpu.sh sets beside
Trident and llm.c.

The plain GPT-2 of scripts/torch_gpt2.py, run as PyTorch users run it for speed: bf16
autocast, F.scaled_dot_product_attention (causal; Flash or cuDNN attention), torch.compile of
the whole model, fused AdamW, clip_grad_norm_, and gradient accumulation over micro batches to the same tokens per step as the others.
Trains on random tokens and prints, last, one JSON line: tokens_per_s (the median step over
the timed steps), step_ms, peak_memory_bytes (torch.cuda.max_memory_allocated) and what ran.

On a machine without a GPU (--device cpu, --dtype fp32, --no-compile) it runs the same code
path but the autocast and the fused optimizer, which proves the script; its speed there
means nothing. A PyTorch without scaled_dot_product_attention gets the explicit masked
softmax instead, said in the JSON line ("attention").
"""
import argparse
import json
import statistics
import time

import torch

from torch_gpt2 import Gpt, has_fused_attention  # beside this script


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--global-batch", type=int, default=64, help="sequences per step")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--no-compile", action="store_true")
    a = p.parse_args()
    if a.global_batch % a.micro_batch:
        p.error("--global-batch must be a multiple of --micro-batch")
    accumulation = a.global_batch // a.micro_batch
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    if cuda:
        # fp32 products on TF32 tensor cores, as Trident (training.tf32) and llm.c do.
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    torch.manual_seed(0)
    model = Gpt(a.vocab, a.seq, a.layers, a.hidden, a.heads, 4 * a.hidden,
                fused_attention=True).to(device)
    compiled = not a.no_compile
    if compiled:
        if not hasattr(torch, "compile"):
            p.error("this PyTorch has no torch.compile; run with --no-compile")
        model = torch.compile(model)
    optimizer_args = dict(lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    if cuda:
        optimizer_args["fused"] = True
    optimizer = torch.optim.AdamW(model.parameters(), **optimizer_args)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.dtype == "bf16")
    generator = torch.Generator(device="cpu").manual_seed(1)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    times = []
    for step in range(a.warmup + a.steps):
        tokens = torch.randint(0, a.vocab, (accumulation, a.micro_batch, a.seq + 1),
                               generator=generator).to(device)
        sync()
        t0 = time.perf_counter()
        loss_sum = torch.zeros((), device=device)
        for micro in range(accumulation):
            with autocast:
                loss = model(tokens[micro, :, :-1], tokens[micro, :, 1:]) / accumulation
            loss.backward()
            loss_sum += loss.detach()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        dt = time.perf_counter() - t0
        if step >= a.warmup:
            times.append(dt)
        print(f"step {step + 1} | loss {loss_sum.item():.4f} | norm {norm.item():.3f} | "
              f"{1e3 * dt:.1f} ms", flush=True)
    step_s = statistics.median(times)
    attention = "sdpa" if has_fused_attention() else "explicit"
    print(json.dumps({
        "trainer": "pytorch", "tokens_per_s": a.global_batch * a.seq / step_s,
        "step_ms": 1e3 * step_s,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if cuda else 0,
        "torch": torch.__version__, "compile": compiled, "attention": attention,
        "dtype": a.dtype, "micro_batch": a.micro_batch, "global_batch": a.global_batch,
        "device": torch.cuda.get_device_name(device) if cuda else "cpu"}))


if __name__ == "__main__":
    main()
