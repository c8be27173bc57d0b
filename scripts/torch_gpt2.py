"""The GPT-2 that the PyTorch benchmarks train (scripts/bench_pytorch.py on the CPU,
scripts/bench_gpt2_torch.py on a GPU): tied LM head, pre-LayerNorm, GELU tanh, learned
positions, no dropout, GPT-2's initialisation, written as PyTorch users write it.

Attention is the explicit masked softmax, or with fused_attention=True (and a PyTorch that
has it) F.scaled_dot_product_attention, causal (Flash or cuDNN attention on a GPU).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def has_fused_attention():
    return hasattr(F, "scaled_dot_product_attention")


class Block(nn.Module):
    def __init__(self, hidden, heads, ffn, fused_attention):
        super().__init__()
        self.heads = heads
        self.fused_attention = fused_attention and has_fused_attention()
        self.ln_1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln_2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def attention(self, q, k, v):  # (B, NH, T, hs) each
        if self.fused_attention:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        T = q.shape[2]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        return att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = self.attention(q, k, v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, vocab, seq, layers, hidden, heads, ffn, fused_attention=False):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads, ffn, fused_attention)
                                    for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        for name, p in self.named_parameters():  # GPT-2 initialisation
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        """The mean cross-entropy of the next tokens (the logits in fp32 under autocast)."""
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))
