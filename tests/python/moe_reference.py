"""A float64 PyTorch mixture of experts of exactly the semantics Trident's `model.moe` promises
(docs/ARCHITECTURE.md, "Mixture of experts"), on llama_reference.py's Llama, written from the
formulas with no permutation: every expert runs on every token and a token's output sums the
chosen experts' outputs by their weights.

- logits z = x·W_rᵀ; softmax router: p = softmax(z), the k largest p (ties: the lower index),
  w = p / Σ_k p (normalize_top_k) or p; sigmoid router: s = sigmoid(z), the k largest s + b,
  w = s / Σ_k s or s, and p = s / Σ s for the balancing loss; w times `scale`;
- out = Σ_k w_e · down_e(silu(gate_e(x)) · up_e(x)) + shared(x);
- per microbatch and MoE layer: aux = N·Σ_e f_e·P_e with f_e the fraction of the T·k choices
  that went to e and P_e the mean of p over the T tokens; z = mean_t (logsumexp z_t)²;
- the loss trained: mean over microbatches of cross-entropy + aux_loss·Σ aux + z_loss·Σ z;
- capacity_factor c > 0: each expert keeps, of each microbatch's choices, the ceil(c·T·k/N) of
  the highest weight (ties: the earlier token); the others' weights are 0;
- after each update (update_bias), DeepSeek-V3's balancing: load_e the choices expert e received
  over the whole global batch, b_e += bias_update_rate · sign(mean(load) − load_e).

check_ops holds the hand-written softmax, top-k and SwiGLU against torch's own.
Standard library, numpy and torch.
"""
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_reference as llama  # noqa: E402


class Moe:
    """model.moe's settings, with its defaults."""

    def __init__(self, experts, top_k=2, ffn=0, shared=0, router="softmax", normalize=True,
                 scale=1.0, aux_loss=0.01, z_loss=0.0, first_dense=0, every=1,
                 bias_update_rate=0.0, capacity_factor=0.0):
        self.experts, self.top_k, self.ffn, self.shared = experts, top_k, ffn, shared
        self.router, self.normalize, self.scale = router, normalize, scale
        self.aux_loss, self.z_loss = aux_loss, z_loss
        self.first_dense, self.every = first_dense, every
        self.bias_update_rate = bias_update_rate
        self.capacity_factor = capacity_factor

    def moe_layer(self, layer):
        return layer >= self.first_dense and (layer + 1) % self.every == 0

    def overrides(self):
        """The same settings as trident's --set overrides."""
        values = {"experts": self.experts, "top_k": self.top_k, "ffn_hidden": self.ffn,
                  "shared_experts": self.shared, "router": self.router,
                  "normalize_top_k": str(self.normalize).lower(), "scale": self.scale,
                  "aux_loss": self.aux_loss, "z_loss": self.z_loss,
                  "first_dense": self.first_dense, "every": self.every,
                  "bias_update_rate": self.bias_update_rate,
                  "capacity_factor": self.capacity_factor}
        return [f"model.moe.{k}={v}" for k, v in values.items()]


def softmax(z):
    e = torch.exp(z - z.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def top_k(key, k):
    """Indices of the k largest of each row, highest first, the lower index on a tie."""
    order = torch.sort(-key, dim=-1, stable=True).indices
    return order[:, :k]


def swiglu(gate, up):
    return gate / (1.0 + torch.exp(-gate)) * up


class Expert(nn.Module):
    def __init__(self, hidden, width):
        super().__init__()
        self.gate_proj = llama.linear(hidden, width)
        self.up_proj = llama.linear(hidden, width)
        self.down_proj = llama.linear(width, hidden)

    def forward(self, x):
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


class MoeMLP(nn.Module):
    def __init__(self, hidden, moe):
        super().__init__()
        self.moe = moe
        self.gate = llama.linear(hidden, moe.experts)
        if moe.router == "sigmoid":  # not trained; 0 until the bias's update moves it
            self.gate.e_score_correction_bias = nn.Parameter(
                torch.zeros(moe.experts, dtype=torch.float64), requires_grad=False)
        self.experts = nn.ModuleList(Expert(hidden, moe.ffn) for _ in range(moe.experts))
        if moe.shared:
            self.shared_experts = Expert(hidden, moe.shared * moe.ffn)
        self.losses = []  # (aux, z) of each forward
        self.load = torch.zeros(moe.experts, dtype=torch.float64)  # choices since update_bias
        self.dropped = 0  # choices a capacity dropped since update_bias

    def route(self, z):
        """Each token's k experts and weights, and p of the balancing loss, from z (T, N)."""
        m = self.moe
        if m.router == "sigmoid":
            score = torch.sigmoid(z)
            chosen = top_k(score + self.gate.e_score_correction_bias, m.top_k)
            p = score / score.sum(-1, keepdim=True)
        else:
            score = p = softmax(z)
            chosen = top_k(score, m.top_k)
        w = score.gather(-1, chosen)
        if m.normalize:
            w = w / w.sum(-1, keepdim=True)
        w = w * m.scale
        if m.capacity_factor > 0:
            w = w * self.kept(chosen, w)
        return chosen, w, p

    def kept(self, chosen, w):
        """1 for the choices each expert keeps under the capacity ceil(c·T·k/N) of the T tokens
        routed together, those of the highest weight (ties: the earlier token), 0 for the others
        (Megatron-Core's "probs" drop policy)."""
        m, tokens = self.moe, chosen.shape[0]
        capacity = math.ceil(m.capacity_factor * tokens * m.top_k / m.experts)
        mask = torch.ones_like(w)
        for e in range(m.experts):
            mine = [(-w[t, s].item(), t, s) for t in range(tokens) for s in range(m.top_k)
                    if chosen[t, s] == e]
            for _, t, s in sorted(mine)[capacity:]:
                mask[t, s] = 0.0
        self.dropped += int((mask == 0).sum())
        return mask

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        z = self.gate(x)
        chosen, w, p = self.route(z)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            weight = (w * (chosen == e)).sum(-1, keepdim=True)
            out = out + weight * expert(x)
        if self.moe.shared:
            out = out + self.shared_experts(x)
        m, tokens = self.moe, x.shape[0]
        counts = torch.stack([(chosen == e).sum() for e in range(m.experts)]).double()
        self.load = self.load + counts
        f = counts / (tokens * m.top_k)
        aux = m.experts * (f * p.mean(0)).sum()
        zl = (torch.logsumexp(z, -1) ** 2).mean()
        self.losses.append((aux, zl))
        return out.reshape(shape)


class MoeLlama(llama.LlamaReference):
    """Llama with model.moe's layers; loss() takes a global batch in microbatches."""

    def __init__(self, shape, moe):
        super().__init__(shape)
        self.moe = moe
        for i, layer in enumerate(self.layers):
            if moe.moe_layer(i):
                layer.mlp = MoeMLP(shape.hidden, moe)

    def moe_layers(self):
        return [layer.mlp for layer in self.layers if isinstance(layer.mlp, MoeMLP)]

    def losses(self, inputs, targets, micro_batch):
        """(cross-entropy, loss trained, Σ aux, Σ z), each the mean over the microbatches."""
        ce = trained = aux = zl = 0.0
        count = inputs.shape[0] // micro_batch
        for i in range(count):
            rows = slice(i * micro_batch, (i + 1) * micro_batch)
            for mlp in self.moe_layers():
                mlp.losses.clear()
            loss = llama.LlamaReference.loss(self, inputs[rows], targets[rows])
            a = sum(mlp.losses[0][0] for mlp in self.moe_layers())
            z = sum(mlp.losses[0][1] for mlp in self.moe_layers())
            ce = ce + loss / count
            aux, zl = aux + a / count, zl + z / count
            trained = trained + (loss + self.moe.aux_loss * a + self.moe.z_loss * z) / count
        return ce, trained, aux, zl

    def update_bias(self, applied=True):
        """Each MoE layer's loads since the last call, and (sigmoid, after an applied update)
        its bias moved by bias_update_rate against each expert's excess: the loads, per layer
        (and the choices dropped since then, in self.dropped)."""
        loads, self.dropped = [], []
        for mlp in self.moe_layers():
            load, mlp.load = mlp.load, torch.zeros_like(mlp.load)
            loads.append(load)
            self.dropped.append(mlp.dropped)
            mlp.dropped = 0
            if applied and self.moe.router == "sigmoid":
                with torch.no_grad():
                    mlp.gate.e_score_correction_bias += (
                        self.moe.bias_update_rate * torch.sign(load.mean() - load))
        return loads


def check_ops(seed=3):
    """The largest differences of the hand-written softmax, top-k and SwiGLU from torch's."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(64, 8, generator=g, dtype=torch.float64)
    errors = [("softmax", (softmax(z) - torch.softmax(z, -1)).abs().max().item())]
    chosen = top_k(z, 3)
    errors.append(("top-k", float((chosen != torch.topk(z, 3, dim=-1).indices).sum())))
    tie = torch.tensor([[0.5, 0.9, 0.9, 0.1, 0.9]], dtype=torch.float64)
    errors.append(("top-k ties to the lower index",
                   float((top_k(tie, 2) != torch.tensor([[1, 2]])).sum())))
    a, b = torch.randn(2, 16, 8, generator=g, dtype=torch.float64)
    errors.append(("swiglu", (swiglu(a, b) - F.silu(a) * b).abs().max().item()))
    return errors
