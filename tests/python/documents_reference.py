"""The packed-documents semantics (data.documents: mask, docs/ARCHITECTURE.md "Packed
documents") in float64 PyTorch, written with explicit boolean masks over the reference models
of gpt2_reference.py and llama_reference.py:

- a document ends after each eod token; a window's first token starts one;
- token i attends to token j <= i only when no eod lies at a position in [j, i);
- positions restart at 0 at each document start (GPT-2's wpe, a llama's rotary angle);
- with mask_eod_loss a position whose input is eod counts no loss; the loss is the sum of the
  counted losses over the counted positions of the whole global batch.

per_document_logits runs each document alone through the plain models, the independent check
of the masks (test_documents.py holds the two together).
"""
import math

import torch

import llama_reference as llama


def allowed(inputs, eod):
    """(B, T, T) bool: query i may attend key j."""
    B, T = inputs.shape
    out = torch.zeros(B, T, T, dtype=torch.bool)
    for b in range(B):
        for i in range(T):
            for j in range(i + 1):
                out[b, i, j] = not bool((inputs[b, j:i] == eod).any())
    return out


def positions(inputs, eod):
    """(B, T) int64: each token's position within its document."""
    B, T = inputs.shape
    out = torch.zeros(B, T, dtype=torch.int64)
    for b in range(B):
        p = 0
        for t in range(T):
            out[b, t] = p
            p = 0 if inputs[b, t] == eod else p + 1
    return out


def counted(inputs, eod, mask_eod_loss):
    """(B, T) float64: 1 where the position's loss counts."""
    keep = torch.ones(inputs.shape, dtype=torch.float64)
    return keep.masked_fill(inputs == eod, 0.0) if mask_eod_loss else keep


def attend(q, k, v, mask):
    """softmax(q kᵀ / √d) v over the allowed keys; q, k, v (B, NH, T, d), mask (B, T, T)."""
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    return (weights / weights.sum(dim=-1, keepdim=True)) @ v


def gpt2_logits(model, inputs, mask, pos):
    x = model.wte.weight[inputs] + model.wpe.weight[pos]
    for block in model.h:
        a = block.attn
        h = block.ln_1(x)
        B, T, C = h.shape
        q, k, v = (t.reshape(B, T, a.heads, C // a.heads).transpose(1, 2)
                   for t in a.c_attn(h).split(C, dim=-1))
        x = x + a.c_proj(attend(q, k, v, mask).transpose(1, 2).reshape(B, T, C))
        x = x + block.mlp(block.ln_2(x))
    return model.ln_f(x) @ model.wte.weight.t()


def rotate_rows(x, pos, theta):
    """x (B, NH, T, d) rotated at per-row positions pos (B, T), as llama_reference.rotate."""
    d = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = pos.to(torch.float64)[:, None, :, None] * inv_freq           # (B, 1, T, d/2)
    cos, sin = torch.cat([angles.cos()] * 2, dim=-1), torch.cat([angles.sin()] * 2, dim=-1)
    half = d // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def llama_logits(model, inputs, mask, pos):
    s = model.shape
    x = model.embed_tokens.weight[inputs]
    for layer in model.layers:
        a = layer.self_attn
        h = layer.input_layernorm(x)
        B, T, C = h.shape
        d = C // s.heads
        q = a.q_proj(h).reshape(B, T, s.heads, d).transpose(1, 2)
        k = a.k_proj(h).reshape(B, T, s.kv_heads, d).transpose(1, 2)
        v = a.v_proj(h).reshape(B, T, s.kv_heads, d).transpose(1, 2)
        q, k = rotate_rows(q, pos, s.rope_theta), rotate_rows(k, pos, s.rope_theta)
        group = s.heads // s.kv_heads
        y = attend(q, llama.repeat_kv(k, group), llama.repeat_kv(v, group), mask)
        x = x + a.o_proj(y.transpose(1, 2).reshape(B, T, C))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    head = model.embed_tokens.weight if s.tied else model.lm_head.weight
    return model.norm(x) @ head.t()


def logits(model, inputs, eod):
    """The masked model's logits (B, T, V) of `inputs` (B, T)."""
    mask, pos = allowed(inputs, eod), positions(inputs, eod)
    if hasattr(model, "wte"):
        return gpt2_logits(model, inputs, mask, pos)
    return llama_logits(model, inputs, mask, pos)


def per_document_logits(model, inputs, eod):
    """The same logits, each document of each window run alone through the plain model."""
    rows = []
    for window in inputs:
        pieces, start = [], 0
        for t in range(len(window)):
            if window[t] == eod or t == len(window) - 1:
                pieces.append(model.logits(window[None, start:t + 1])[0])
                start = t + 1
        rows.append(torch.cat(pieces))
    return torch.stack(rows)


def loss(model, inputs, targets, eod, mask_eod_loss):
    """Σ counted losses / counted positions of the batch `inputs` (B, T)."""
    out = logits(model, inputs, eod)
    top = out.amax(dim=-1, keepdim=True)
    log_norm = torch.log(torch.exp(out - top).sum(dim=-1)) + top.squeeze(-1)
    losses = log_norm - out.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    weights = counted(inputs, eod, mask_eod_loss)
    return (losses * weights).sum() / weights.sum()
