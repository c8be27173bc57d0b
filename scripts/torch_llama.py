"""The Llama that the PyTorch CPU benchmark trains (scripts/bench_pytorch.py --arch llama):
Hugging Face LlamaForCausalLM's model written as PyTorch users write it, fp32: RMSNorm,
rotary positions (rotate-half), grouped-query attention (each key/value head repeated over
its query heads, the explicit masked softmax), SwiGLU, no biases, an untied LM head.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, hidden, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x, cos, sin):  # x (B, NH, T, hs); cos, sin (T, hs)
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class Block(nn.Module):
    def __init__(self, hidden, heads, kv_heads, ffn):
        super().__init__()
        self.heads, self.kv_heads, self.hs = heads, kv_heads, hidden // heads
        self.norm_1 = RMSNorm(hidden)
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.k = nn.Linear(hidden, kv_heads * self.hs, bias=False)
        self.v = nn.Linear(hidden, kv_heads * self.hs, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.norm_2 = RMSNorm(hidden)
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = self.norm_1(x)
        q = self.q(h).view(B, T, self.heads, self.hs).transpose(1, 2)
        k = self.k(h).view(B, T, self.kv_heads, self.hs).transpose(1, 2)
        v = self.v(h).view(B, T, self.kv_heads, self.hs).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hs)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        y = (att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, C))
        h = self.norm_2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, vocab, seq, layers, hidden, heads, kv_heads, ffn, theta=10000.0):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads, kv_heads, ffn) for _ in range(layers))
        self.norm = RMSNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)
        hs = hidden // heads
        angles = torch.arange(seq)[:, None] * theta ** (-torch.arange(0, hs, 2) / hs)[None, :]
        self.register_buffer("cos", torch.cat([angles.cos(), angles.cos()], dim=-1))
        self.register_buffer("sin", torch.cat([angles.sin(), angles.sin()], dim=-1))
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x, self.cos[:T], self.sin[:T])
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
