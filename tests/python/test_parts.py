#!/usr/bin/python3
"""Every part of the model on its own (part_harness.py, tests/tools/part_check.cpp), forward and
backward against the PyTorch layer it stands for, float64: the split linear column- and
row-wise, LayerNorm, RMSNorm, attention multi-head (GPT-2's, with biases) and grouped-query
(Llama's, rotary positions), the MLPs (GELU, SwiGLU, ReLU²), the embedding (vocabulary-split,
with positions) and the LM head with its loss (the final norm, the tied or own head, the
vocabulary-parallel cross-entropy). Each within 1e-5 of PyTorch on one process, and split over
M = 2 tensor ranks, with and without sequence parallelism (the linears also with their exchanges
overlapped, parallel.tp_overlap), within 1e-5 of one process.

Exit 77 (skipped) without torch and numpy or mpirun.
"""
import argparse
import math
import os
import shutil
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print(f"SKIP: the PyTorch reference needs torch and numpy ({e})")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe_reference as moe_ref  # noqa: E402
import part_harness as ph  # noqa: E402

# B = 2 sequences of T = 8, H = 32, 4 heads (2 key/value heads for grouped-query attention),
# F = 64, a vocabulary of 300 (padded to 128·M: at M = 2 each rank holds real rows).
SHAPE = {"batch": 2, "seq": 8, "hidden": 32, "heads": 4, "kv_heads": 2, "ffn": 64, "vocab": 300}
B, T, H, NH, KVH, FF, V = 2, 8, 32, 4, 2, 64, 300
N = B * T
RNG = np.random.default_rng(42)


def rand(*shape, scale=0.5):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def linear(x, w, b=None):
    return x @ w.t() + (b if b is not None else 0)


def causal(q, k, v, heads):
    """Softmax attention of (B, T, heads·d) q against k, v of as many heads, causal."""
    d = q.shape[-1] // heads
    q, k, v = (t.reshape(B, T, heads, d).transpose(1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(N, heads * d)


def rotate(x, heads, theta=10000.0):
    """Hugging Face's rotate-half rotary positions at 0 .. T-1, x (N, heads·d)."""
    d = x.shape[-1] // heads
    x = x.reshape(B, T, heads, d)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * \
        theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    cos = torch.cat([angle.cos(), angle.cos()], -1)[None, :, None, :]
    sin = torch.cat([angle.sin(), angle.sin()], -1)[None, :, None, :]
    half = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
    return (x * cos + half * sin).reshape(N, heads * d)


def rms_norm(x, w, eps=1e-5):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def gpt2_attention(p, x, _):
    q, k, v = linear(x, p["h.0.attn.c_attn.weight"], p["h.0.attn.c_attn.bias"]).split(H, -1)
    return linear(causal(q, k, v, NH), p["h.0.attn.c_proj.weight"], p["h.0.attn.c_proj.bias"])


def grouped_attention(p, x, _):
    at = "layers.0.self_attn."
    q = rotate(linear(x, p[at + "q_proj.weight"]), NH)
    k = rotate(linear(x, p[at + "k_proj.weight"]), KVH)
    v = linear(x, p[at + "v_proj.weight"])
    d = H // NH
    k, v = (t.reshape(N, KVH, d).repeat_interleave(NH // KVH, 1).reshape(N, H) for t in (k, v))
    return linear(causal(q, k, v, NH), p[at + "o_proj.weight"])


def cases():
    d = H // NH
    x, dy = {"x": rand(N, H), "dy": rand(N, H)}, rand(N, H)
    gpt2_mlp = {"h.0.mlp.c_fc.weight": rand(FF, H), "h.0.mlp.c_fc.bias": rand(FF),
                "h.0.mlp.c_proj.weight": rand(H, FF), "h.0.mlp.c_proj.bias": rand(H)}
    layer = {"x": x["x"], "dy": dy}
    fc = {k: v for k, v in gpt2_mlp.items() if ".c_fc." in k}
    proj = {k: v for k, v in gpt2_mlp.items() if ".c_proj." in k}
    yield ph.PartCase("linear:column", "gpt2", SHAPE, fc, {"x": x["x"], "dy": rand(N, FF)},
                      lambda p, x, _: linear(x, p["h.0.mlp.c_fc.weight"], p["h.0.mlp.c_fc.bias"]))
    yield ph.PartCase("linear:row", "gpt2", SHAPE, proj, {"x": rand(N, FF), "dy": dy},
                      lambda p, x, _: linear(x, p["h.0.mlp.c_proj.weight"],
                                             p["h.0.mlp.c_proj.bias"]))
    ln = {"h.0.ln_1.weight": 1 + rand(H), "h.0.ln_1.bias": rand(H)}
    yield ph.PartCase("norm:layernorm", "gpt2", SHAPE, ln, layer,
                      lambda p, x, _: F.layer_norm(x, (H,), p["h.0.ln_1.weight"],
                                                   p["h.0.ln_1.bias"], 1e-5))
    yield ph.PartCase("norm:rmsnorm", "llama", SHAPE,
                      {"layers.0.input_layernorm.weight": 1 + rand(H)}, layer,
                      lambda p, x, _: rms_norm(x, p["layers.0.input_layernorm.weight"]))
    attn = {"h.0.attn.c_attn.weight": rand(3 * H, H), "h.0.attn.c_attn.bias": rand(3 * H),
            "h.0.attn.c_proj.weight": rand(H, H), "h.0.attn.c_proj.bias": rand(H)}
    yield ph.PartCase("attention:gpt2", "gpt2", SHAPE, attn, layer, gpt2_attention)
    at = "layers.0.self_attn."
    gqa = {at + "q_proj.weight": rand(H, H), at + "k_proj.weight": rand(KVH * d, H),
           at + "v_proj.weight": rand(KVH * d, H), at + "o_proj.weight": rand(H, H)}
    yield ph.PartCase("attention:grouped", "llama", SHAPE, gqa, layer, grouped_attention)
    yield from mlp_cases(gpt2_mlp, layer)
    yield from end_cases(dy)


def mlp_cases(gpt2_mlp, layer):
    def gelu(p, x, _):
        h = F.gelu(linear(x, p["h.0.mlp.c_fc.weight"], p["h.0.mlp.c_fc.bias"]), approximate="tanh")
        return linear(h, p["h.0.mlp.c_proj.weight"], p["h.0.mlp.c_proj.bias"])
    yield ph.PartCase("mlp:gelu", "gpt2", SHAPE, gpt2_mlp, layer, gelu)
    m = "layers.0.mlp."
    swiglu = {m + "gate_proj.weight": rand(FF, H), m + "up_proj.weight": rand(FF, H),
              m + "down_proj.weight": rand(H, FF)}
    yield ph.PartCase("mlp:swiglu", "llama", SHAPE, swiglu, layer,
                      lambda p, x, _: linear(F.silu(linear(x, p[m + "gate_proj.weight"])) *
                                             linear(x, p[m + "up_proj.weight"]),
                                             p[m + "down_proj.weight"]))
    yield from moe_cases(layer)
    relu2 = {"h.0.mlp.fc.weight": rand(FF, H), "h.0.mlp.proj.weight": rand(H, FF)}
    yield ph.PartCase("mlp:relu2", "gpt2", SHAPE, relu2, layer,
                      lambda p, x, _: linear(F.relu(linear(x, p["h.0.mlp.fc.weight"])).square(),
                                             p["h.0.mlp.proj.weight"]))


def moe_cases(layer):
    """The mixture of experts (model/moe_mlp.cpp) against moe_reference.py's layer: 4 experts of
    width 16, top-2 softmax with one shared expert, and top-3 sigmoid unnormalized at scale 2.5.
    The balancing and z losses have no gradient here (a part alone has no loss)."""
    m, E, FE = "layers.0.mlp.", 4, 16
    for label, moe in (("softmax", moe_ref.Moe(E, 2, FE, shared=1)),
                       ("sigmoid", moe_ref.Moe(E, 3, FE, router="sigmoid", normalize=False,
                                               scale=2.5))):
        params = {m + "gate.weight": rand(E, H)}
        if moe.router == "sigmoid":
            params[m + "gate.e_score_correction_bias"] = np.zeros(E, np.float32)
        for e in range(E):
            params.update({m + f"experts.{e}.gate_proj.weight": rand(FE, H),
                           m + f"experts.{e}.up_proj.weight": rand(FE, H),
                           m + f"experts.{e}.down_proj.weight": rand(H, FE)})
        if moe.shared:
            params.update({m + "shared_experts.gate_proj.weight": rand(FE, H),
                           m + "shared_experts.up_proj.weight": rand(FE, H),
                           m + "shared_experts.down_proj.weight": rand(H, FE)})
        shape = dict(SHAPE, moe_experts=E, moe_top_k=moe.top_k, moe_ffn=FE,
                     moe_shared=moe.shared, moe_sigmoid=moe.router == "sigmoid",
                     moe_normalize=moe.normalize, moe_scale=moe.scale)
        yield ph.PartCase("mlp:moe", "llama", shape, params, layer, moe_layer(moe, m), label=label)


def moe_layer(moe, m):
    """The reference layer with the case's tensors."""
    def forward(p, x, _):
        layer = moe_ref.MoeMLP(H, moe)
        for name, value in p.items():
            module, attr = layer, name[len(m):].split(".")
            for a in attr[:-1]:
                module = getattr(module, a) if not a.isdigit() else module[int(a)]
            delattr(module, attr[-1])
            setattr(module, attr[-1], value)
        return layer(x)
    return forward


def end_cases(dy):
    tokens = RNG.integers(0, V, N)
    emb = {"wte.weight": rand(V, H), "wpe.weight": rand(T, H)}
    yield ph.PartCase("embedding", "gpt2", SHAPE, emb, {"tokens": tokens.astype(np.float32),
                                                        "dy": dy},
                      lambda p, _, i: p["wte.weight"][torch.tensor(tokens)] +
                      p["wpe.weight"][torch.arange(T).repeat(B)])
    targets = RNG.integers(0, V, N)

    def tied(p, x, _):
        h = F.layer_norm(x, (H,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
        return F.cross_entropy(h @ p["wte.weight"].t(), torch.tensor(targets))
    head = {"ln_f.weight": 1 + rand(H), "ln_f.bias": rand(H), "wte.weight": rand(V, H)}
    yield ph.PartCase("head", "gpt2", SHAPE, head,
                      {"x": rand(N, H), "targets": targets.astype(np.float32)}, tied, loss=True)

    def own(p, x, _):
        return F.cross_entropy(rms_norm(x, p["norm.weight"]) @ p["lm_head.weight"].t(),
                               torch.tensor(targets))
    yield ph.PartCase("head", "llama", SHAPE, {"norm.weight": 1 + rand(H),
                                               "lm_head.weight": rand(V, H)},
                      {"x": rand(N, H), "targets": targets.astype(np.float32)}, own, loss=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trident", required=True)
    p.add_argument("--tools-dir", required=True)
    a = p.parse_args()
    if shutil.which("mpirun") is None:
        print("SKIP: mpirun not found (Debian's openmpi-bin)")
        return 77
    tool = os.path.join(a.tools_dir, "trident_part_check")
    for case in cases():
        ph.check_part(tool, case)
    print(f"{len(ph.failures)} failed" if ph.failures else "all passed")
    return 1 if ph.failures else 0


if __name__ == "__main__":
    sys.exit(main())
