"""The Llama that the PyTorch CPU benchmark trains (scripts/bench_pytorch.py --arch llama):
Hugging Face LlamaForCausalLM's model written as PyTorch users write it, fp32: RMSNorm,
rotary positions (rotate-half), grouped-query attention (each key/value head repeated over
its query heads, the explicit masked softmax), SwiGLU, no biases, an untied LM head. With
experts > 0 every MLP is a mixture of experts as Hugging Face's Mixtral and Qwen3-MoE write
it: a softmax router, the top k weights renormalized, a loop over the experts gathering each
one's tokens and adding its weighted output back (index_add_), an optional shared SwiGLU, and
the load-balancing and z losses added to the loss.
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


class SwiGLU(nn.Module):
    def __init__(self, hidden, ffn):
        super().__init__()
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Moe(nn.Module):
    """Experts of width `ffn`, each token to its top_k; `shared` always-on experts' width
    folded into one SwiGLU. Keeps its balancing (aux) and z losses for the model's loss."""

    def __init__(self, hidden, ffn, experts, top_k, shared, aux=0.01, z=0.001):
        super().__init__()
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(hidden, ffn) for _ in range(experts))
        self.shared = SwiGLU(hidden, shared * ffn) if shared else None
        self.top_k, self.aux, self.z = top_k, aux, z
        self.loss = 0.0

    def forward(self, x):
        B, T, C = x.shape
        rows = x.reshape(-1, C)
        logits = self.router(rows)
        probs = logits.softmax(dim=-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(rows)
        mask = F.one_hot(chosen, len(self.experts)).permute(2, 1, 0)  # (experts, k, rows)
        for e, expert in enumerate(self.experts):
            slot, token = torch.where(mask[e])
            if token.numel():
                y = expert(rows[token]) * weights[token, slot, None]
                out.index_add_(0, token, y)
        if self.shared is not None:
            out = out + self.shared(rows)
        share = mask.sum(dim=(1, 2)).float() / (rows.shape[0] * self.top_k)
        self.loss = (self.aux * len(self.experts) * (share * probs.mean(dim=0)).sum() +
                     self.z * torch.logsumexp(logits, dim=-1).pow(2).mean())
        return out.view(B, T, C)


class Block(nn.Module):
    def __init__(self, hidden, heads, kv_heads, mlp):
        super().__init__()
        self.heads, self.kv_heads, self.hs = heads, kv_heads, hidden // heads
        self.norm_1 = RMSNorm(hidden)
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.k = nn.Linear(hidden, kv_heads * self.hs, bias=False)
        self.v = nn.Linear(hidden, kv_heads * self.hs, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.norm_2 = RMSNorm(hidden)
        self.mlp = mlp

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
        return x + self.mlp(self.norm_2(x))


class Llama(nn.Module):
    # moe: (experts, top_k, shared) for mixtures of experts of width ffn, or None.
    def __init__(self, vocab, seq, layers, hidden, heads, kv_heads, ffn, theta=10000.0, moe=None):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(
            Block(hidden, heads, kv_heads, Moe(hidden, ffn, *moe) if moe else SwiGLU(hidden, ffn))
            for _ in range(layers))
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
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
        return loss + sum(b.mlp.loss for b in self.blocks if isinstance(b.mlp, Moe))
