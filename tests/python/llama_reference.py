# The independent PyTorch reference for Trident's llama model (model.arch: llama): Hugging Face
# LlamaForCausalLM's semantics in float64, written from the contracts in docs/ARCHITECTURE.md
# and the statement of them, not from Trident's code:
#   - RMSNorm x·rsqrt(mean(x²) + eps)·w;
#   - rotary positions in the rotate-half convention (the two halves of each head rotate
#     together, inv_freq_i = θ^(−2i/d));
#   - grouped-query attention: key/value head j serves query heads j·g .. j·g + g − 1, g =
#     heads / kv_heads;
#   - SwiGLU down(silu(gate(x)) · up(x)); no biases; an untied LM head.
# Parameters are named as Hugging Face's without the "model." prefix (lm_head.weight as is).
# Low-rank adapters (Hu et al. 2021, as PEFT's LoRA Linear): add_lora() wraps the named linears
# of every layer as W x + s·B (A x) with A (r, in) and B (out, r) trained and W frozen.
# check_layers() holds each piece against torch's own functions (F.normalize, the fused
# scaled-dot-product attention, F.silu, complex multiplication by torch.polar).

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import gpt2_reference as common


class LlamaShape:
    def __init__(self, vocab, seq_len, layers, hidden, heads, kv_heads, ffn, tied=False,
                 rope_theta=10000.0, norm_eps=1e-5, qk_norm=False, head_dim=None):
        # Each head's width d: hidden / heads unless given (Hugging Face's head_dim, Qwen3's).
        d = head_dim if head_dim is not None else hidden // heads
        if (head_dim is None and hidden % heads) or heads % kv_heads or d % 2:
            raise ValueError("hidden, heads, kv_heads and head_dim do not fit")
        self.vocab, self.seq_len, self.layers = vocab, seq_len, layers
        self.hidden, self.heads, self.kv_heads, self.ffn = hidden, heads, kv_heads, ffn
        self.tied, self.rope_theta, self.norm_eps = tied, rope_theta, norm_eps
        self.qk_norm = qk_norm  # Qwen3's RMSNorm over each query and key head
        self.head_dim = d


def linear(fan_in, fan_out):
    """A bias-free linear, weight [out, in] as torch.nn.Linear."""
    return nn.Linear(fan_in, fan_out, bias=False, dtype=torch.float64)


class RMSNorm(nn.Module):
    def __init__(self, width, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width, dtype=torch.float64))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + self.eps) * self.weight


def rotate(x, positions, theta):
    """x (B, NH, T, d) rotated at `positions` (T): rotate-half, pairs (i, i + d/2)."""
    d = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)    # (d/2)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]        # (T, d/2)
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)                    # (T, d)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1)
    half = d // 2
    rotated_half = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated_half * sin


def causal_attention(q, k, v):
    """softmax(q kᵀ / √d, causal) v, written out; (B, NH, T, d) each."""
    T, d = q.shape[-2], q.shape[-1]
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)
    scores = scores.masked_fill(future, float("-inf"))
    weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    return (weights / weights.sum(dim=-1, keepdim=True)) @ v


def repeat_kv(x, group):
    """(B, KVH, T, d) -> (B, KVH·group, T, d): head j·group + r is key/value head j."""
    B, KVH, T, d = x.shape
    return x[:, :, None].expand(B, KVH, group, T, d).reshape(B, KVH * group, T, d)


class Attention(nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.shape = shape
        d = shape.head_dim
        self.q_proj = linear(shape.hidden, shape.heads * d)
        self.k_proj = linear(shape.hidden, shape.kv_heads * d)
        self.v_proj = linear(shape.hidden, shape.kv_heads * d)
        self.o_proj = linear(shape.heads * d, shape.hidden)
        if shape.qk_norm:  # Qwen3Attention's: one weight of d for every head, before rotary
            self.q_norm = RMSNorm(d, shape.norm_eps)
            self.k_norm = RMSNorm(d, shape.norm_eps)

    def forward(self, x):
        s = self.shape
        B, T, _ = x.shape
        d = s.head_dim
        q = self.q_proj(x).reshape(B, T, s.heads, d).transpose(1, 2)      # (B, NH, T, d)
        k = self.k_proj(x).reshape(B, T, s.kv_heads, d).transpose(1, 2)   # (B, KVH, T, d)
        v = self.v_proj(x).reshape(B, T, s.kv_heads, d).transpose(1, 2)
        if s.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        positions = torch.arange(T)
        q, k = rotate(q, positions, s.rope_theta), rotate(k, positions, s.rope_theta)
        group = s.heads // s.kv_heads
        y = causal_attention(q, repeat_kv(k, group), repeat_kv(v, group))
        return self.o_proj(y.transpose(1, 2).reshape(B, T, s.heads * d))


class MLP(nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.gate_proj = linear(shape.hidden, shape.ffn)
        self.up_proj = linear(shape.hidden, shape.ffn)
        self.down_proj = linear(shape.ffn, shape.hidden)

    def forward(self, x):
        gate = self.gate_proj(x)
        return self.down_proj(gate / (1.0 + torch.exp(-gate)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.input_layernorm = RMSNorm(shape.hidden, shape.norm_eps)
        self.self_attn = Attention(shape)
        self.post_attention_layernorm = RMSNorm(shape.hidden, shape.norm_eps)
        self.mlp = MLP(shape)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaReference(nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.shape = shape
        self.embed_tokens = nn.Embedding(shape.vocab, shape.hidden, dtype=torch.float64)
        self.layers = nn.ModuleList(Layer(shape) for _ in range(shape.layers))
        self.norm = RMSNorm(shape.hidden, shape.norm_eps)
        if not shape.tied:
            self.lm_head = linear(shape.hidden, shape.vocab)

    def logits(self, inputs):                                      # inputs (B, T) int64
        x = self.embed_tokens.weight[inputs]
        for layer in self.layers:
            x = layer(x)
        head = self.embed_tokens.weight if self.shape.tied else self.lm_head.weight
        return self.norm(x) @ head.t()                            # (B, T, V)

    def loss(self, inputs, targets):
        logits = self.logits(inputs)
        top = logits.amax(dim=-1, keepdim=True)
        log_norm = torch.log(torch.exp(logits - top).sum(dim=-1)) + top.squeeze(-1)
        return (log_norm - logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)).mean()


# The linears a LoRA target adapts: (module, its attribute) of each layer, by target name.
LORA_TARGETS = {"q": ("self_attn", "q_proj"), "k": ("self_attn", "k_proj"),
                "v": ("self_attn", "v_proj"), "o": ("self_attn", "o_proj"),
                "gate": ("mlp", "gate_proj"), "up": ("mlp", "up_proj"),
                "down": ("mlp", "down_proj")}


class LoraLinear(nn.Module):
    """A frozen bias-free linear and its adapter: y = x Wᵀ + scale·(x Aᵀ) Bᵀ."""

    def __init__(self, base, a, b, scale):
        super().__init__()
        self.base = base
        self.lora_A = nn.Parameter(torch.tensor(a, dtype=torch.float64))   # (r, in)
        self.lora_B = nn.Parameter(torch.tensor(b, dtype=torch.float64))   # (out, r)
        self.scale = scale

    def forward(self, x):
        return self.base(x) + self.scale * (x @ self.lora_A.t()) @ self.lora_B.t()


def lora_name(layer, target):
    """The adapted linear's name in Trident's adapter layout: layers.3.self_attn.q_proj."""
    module, attribute = LORA_TARGETS[target]
    return f"layers.{layer}.{module}.{attribute}"


def add_lora(model, adapters, targets, scale):
    """Freezes `model` and wraps each target linear of every layer with its adapter;
    adapters[lora_name(l, t) + ".lora_A.weight"] and ".lora_B.weight" hold A and B."""
    for p in model.parameters():
        p.requires_grad_(False)
    for l, layer in enumerate(model.layers):
        for target in targets:
            module, attribute = LORA_TARGETS[target]
            owner = getattr(layer, module)
            stem = lora_name(l, target)
            setattr(owner, attribute, LoraLinear(getattr(owner, attribute),
                                                 adapters[stem + ".lora_A.weight"],
                                                 adapters[stem + ".lora_B.weight"], scale))
    return model


def lora_parameters(model, targets):
    """(Trident's name, parameter) of every adapter factor, in the adapters' layout order."""
    out = []
    for l, layer in enumerate(model.layers):
        for target in targets:
            module, attribute = LORA_TARGETS[target]
            adapted = getattr(getattr(layer, module), attribute)
            stem = lora_name(l, target)
            out += [(stem + ".lora_A.weight", adapted.lora_A),
                    (stem + ".lora_B.weight", adapted.lora_B)]
    return out


def is_decayed(name, p):
    """Weight decay on matrices and embeddings, not on the norms' gains."""
    return p.dim() == 2


def random_init(model, seed, std=0.02):
    """Matrices and embeddings N(0, std), norm gains 1 + 0.1·N(0, 1)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float64)
            p.copy_(std * noise if p.dim() == 2 else 1.0 + 0.1 * noise)
    common.round_to_float32(model)  # Trident reads F32; start from exactly those values


def hf_name(name):
    return name if name.startswith("lm_head.") else "model." + name


def save_hf_weights(model, path):
    """The model as a Hugging Face Llama safetensors file of F32 tensors."""
    common.write_safetensors(
        path, {hf_name(n): p.detach().numpy().astype(np.float32)
               for n, p in model.named_parameters()}, metadata={"format": "pt"})


def make_adamw(model, lr, beta1, beta2, eps, weight_decay):
    decayed = [p for n, p in model.named_parameters() if is_decayed(n, p)]
    plain = [p for n, p in model.named_parameters() if not is_decayed(n, p)]
    return torch.optim.AdamW([{"params": decayed, "weight_decay": weight_decay},
                              {"params": plain, "weight_decay": 0.0}],
                             lr=lr, betas=(beta1, beta2), eps=eps)


def check_layers(seed=5):
    """Each piece against torch's own functions; returns [(name, max abs error)]."""
    g = torch.Generator().manual_seed(seed)
    B, NH, KVH, T, d = 2, 4, 2, 6, 8
    errors = []
    # RMSNorm without eps is x / ‖x‖ · √C: torch's F.normalize.
    x = torch.randn(B, T, NH * d, generator=g, dtype=torch.float64)
    norm = RMSNorm(NH * d, 0.0)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(NH * d, generator=g, dtype=torch.float64))
    want = F.normalize(x, dim=-1) * math.sqrt(NH * d) * norm.weight
    errors.append(("RMSNorm vs F.normalize", (norm(x) - want).abs().max().item()))
    # Rotary as complex multiplication: z = x[:d/2] + i·x[d/2:] times e^{i·angle}.
    q = torch.randn(B, NH, T, d, generator=g, dtype=torch.float64)
    positions = torch.tensor([0, 3, 5, 8, 13, 21])
    angles = positions[:, None].to(torch.float64) * 10000.0 ** (
        -torch.arange(0, d, 2, dtype=torch.float64) / d)
    z = torch.complex(q[..., : d // 2], q[..., d // 2:]) * torch.polar(
        torch.ones_like(angles), angles)
    want = torch.cat([z.real, z.imag], dim=-1)
    errors.append(("rotary vs torch.polar", (rotate(q, positions, 10000.0) - want).abs().max().item()))
    # Grouped causal attention vs torch's fused kernel with each kv head repeated.
    k = torch.randn(B, KVH, T, d, generator=g, dtype=torch.float64)
    v = torch.randn(B, KVH, T, d, generator=g, dtype=torch.float64)
    group = NH // KVH
    want = F._scaled_dot_product_attention(q, k.repeat_interleave(group, dim=1),
                                           v.repeat_interleave(group, dim=1), None, 0.0, False,
                                           True)[0]
    got = causal_attention(q, repeat_kv(k, group), repeat_kv(v, group))
    errors.append(("grouped attention vs F._scaled_dot_product_attention",
                   (got - want).abs().max().item()))
    # SwiGLU's activation vs F.silu.
    mlp = MLP(LlamaShape(10, T, 1, NH * d, NH, KVH, 12))
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.3)
    want = mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
    errors.append(("SwiGLU vs F.silu", (mlp(x) - want).abs().max().item()))
    return errors
