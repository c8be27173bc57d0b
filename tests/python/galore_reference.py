"""GaLore (Zhao et al. 2024) as the official GaLoreAdamW with its 'std' projector computes it,
in PyTorch, for tests/python/test_galore.py: the layers' weight matrices (output x input:
GPT-2's Conv1D weights transposed) step by Adam's moments of their gradient projected to rank r,
every other parameter by torch.optim.AdamW (docs/FORMULAS.md, "GaLore").

The projector comes from torch.linalg.svd in fp32 (the official code's precision) at the
updates 0, T, 2T, ... (0-based), each singular vector's sign chosen so that its component of
largest magnitude is positive (the lowest index on a tie); the projected gradient's moments are
torch.optim.Adam's own exp_avg and exp_avg_sq (the projected gradient given to Adam as the
gradient of a stand-in tensor), and the step is
lr·sqrt(1 - b2^t)/(1 - b1^t)·scale·(N·P or P·N), N = exp_avg/(sqrt(exp_avg_sq) + eps), then
the decay W -= lr·wd·W.
"""
import torch

MATRICES = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight",
            ".mlp.c_proj.weight")


def is_matrix(name):
    return name.startswith("h.") and name.endswith(MATRICES)


def fix_signs(vectors):
    """Each column of `vectors` negated where its component of largest magnitude is negative
    (torch.argmax returns the first maximum: the lowest index on a tie)."""
    largest = vectors.abs().argmax(dim=0)
    signs = torch.sign(vectors[largest, torch.arange(vectors.shape[1])])
    return vectors * torch.where(signs == 0, torch.ones_like(signs), signs)


def projector(g, rank):
    """P of G (m, n): the first r rows of V^T (r, n) if m >= n, else the first r columns of U
    (m, r); from an fp32 SVD, signs fixed, checked to reconstruct G."""
    u, s, vh = torch.linalg.svd(g.float(), full_matrices=False)
    err = (u @ torch.diag(s) @ vh - g.float()).abs().max().item()
    assert err <= 1e-4 * g.abs().max().item(), f"torch.linalg.svd reconstructs G within {err}"
    r = min(rank, *g.shape)
    if g.shape[0] >= g.shape[1]:
        return fix_signs(vh[:r].t()).t().to(g.dtype)
    return fix_signs(u[:, :r]).to(g.dtype)


class GaloreReference:
    """GaLore on the layers' matrices, torch.optim.AdamW on the rest (the same lr, betas, eps
    and decay groups). `t`: training.* values; `galore`: rank, update_gap, scale."""

    def __init__(self, model, t, decayed, galore):
        self.t, self.galore = t, galore
        self.matrices = [(n, p) for n, p in model.named_parameters() if is_matrix(n)]
        rest = [(n, p) for n, p in model.named_parameters() if not is_matrix(n)]
        self.adamw = torch.optim.AdamW(
            [{"params": [p for n, p in rest if decayed(n)], "weight_decay": t["weight_decay"]},
             {"params": [p for n, p in rest if not decayed(n)], "weight_decay": 0.0}],
            lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["eps"])
        self.projectors, self.low, self.adam = {}, {}, {}
        self.updates = 0

    def moments(self, name, r_grad):
        """Adam's exp_avg and exp_avg_sq of the projected gradient, as torch.optim.Adam keeps
        them (its stand-in parameter's own update is not used)."""
        if name not in self.low:
            self.low[name] = torch.zeros_like(r_grad, requires_grad=True)
            self.adam[name] = torch.optim.Adam([self.low[name]], lr=1.0,
                                               betas=(self.t["beta1"], self.t["beta2"]),
                                               eps=self.t["eps"])
        self.low[name].grad = r_grad.clone()
        self.adam[name].step()
        state = self.adam[name].state[self.low[name]]
        return state["exp_avg"], state["exp_avg_sq"]

    def step(self, lr):
        for group in self.adamw.param_groups:
            group["lr"] = lr
        self.adamw.step()
        b1, b2, eps, wd = self.t["beta1"], self.t["beta2"], self.t["eps"], self.t["weight_decay"]
        t = self.updates + 1
        step_size = lr * (1 - b2 ** t) ** 0.5 / (1 - b1 ** t)
        with torch.no_grad():
            for name, p in self.matrices:
                g = p.grad.t()  # (out, in)
                if self.updates % self.galore["update_gap"] == 0:
                    self.projectors[name] = projector(g, self.galore["rank"])
                proj = self.projectors[name]
                right = g.shape[0] >= g.shape[1]
                m, v = self.moments(name, g @ proj.t() if right else proj.t() @ g)
                n = m / (v.sqrt() + eps)
                back = (n @ proj if right else proj @ n) * self.galore["scale"]
                w = p.t() - step_size * back
                p.copy_((w - lr * wd * w).t())
        self.updates += 1
