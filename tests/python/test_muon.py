#!/usr/bin/python3
"""`optimizer.name: muon` (src/optim/muon.h) against a plain PyTorch reading of its formulas,
and on every layout family:

1. ten steps of one process (warmup, cosine decay, weight decay, clipping) against a float64
   PyTorch GPT-2 trained by MuonReference below: the layers' four matrices each by Muon
   (output × input: GPT-2's Conv1D weights transposed), every other parameter by
   torch.optim.AdamW; losses within 1e-5 relative, step by step; once with Moonlight's scale
   and Nesterov, once with the spectral scale and plain momentum;
2. the losses of 10 training steps on every layout family (layout_families.py), bf16 with fp32
   master weights on D=2 (ZeRO-1, ZeRO-3) and P=2, a 2 x 2 x 2 x 1 grid, and llama (k and v replicated over
   M = 2; ZeRO-3), each within 1e-5 of one process's;
   its optimizer state, as the allocator counts it, is 8 bytes per layer-matrix parameter
   (master weight, momentum) and 12 per other (master weight, Adam's moments);
3. checkpoints: one process's step-5 checkpoint resumed on M=2 x D=2 (ZeRO-1) gives the
   uninterrupted run's losses within 1e-5 and, at step 10, its master weights, momentum and
   Adam moments element by element (checkpoint_compare.py, relative to each tensor's largest
   magnitude, 1e-4: the layouts sum in other orders); resuming with another optimizer.name is
   refused with one line, and checkpoint.allow_optimizer_change lets an AdamW checkpoint go on
   with Muon, said once;
4. optimizer.muon.ns_dtype: bf16 (the Newton-Schulz iterations with X and each product rounded
   to bf16, kernels/ops.h): one step's change of the layers' matrices (master weights from a
   step-1 checkpoint) against the reference's with orthogonalize in bf16, relative error in
   norm within 1e-2; and the fp32 run's change more than 1e-2 away from that reference, so the
   comparison tells the two apart. Why 1e-2: both sides round the same values to bf16 (unit
   roundoff 2^-8 = 3.9e-3), but sum each product in another order (OpenBLAS, torch), so an
   element whose fp32 sum straddles a rounding lands one bf16 ulp apart, and the next
   iterations carry those differences on: a few units of bf16's rounding (measured 4.3e-3;
   fp32 against the bf16 reference 4.3e-2).

Exit 77 (skipped) without torch and numpy or mpirun.
"""
import math
import os
import sys
import tempfile

try:
    import numpy as np  # noqa: F401
    import torch
except ImportError as e:
    print(f"SKIP: the PyTorch reference needs torch and numpy ({e})")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint_compare  # noqa: E402
import gpt2_reference as ref  # noqa: E402
import test_gpt2_reference as base  # noqa: E402
from layout_families import FAMILIES, check_families  # noqa: E402
from mpi_harness import binaries_or_skip, check, failures, run, tiny_run  # noqa: E402
from optimizer_resume import check_reshard, resumed  # noqa: E402

MATRICES = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight",
            ".mlp.c_proj.weight")
NS = (3.4445, -4.7750, 2.0315)


def is_matrix(name):
    return name.startswith("h.") and name.endswith(MATRICES)


def orthogonalize(u, steps, ns_dtype="fp32"):
    """Muon's Newton-Schulz iterations on U (A, B), as docs/FORMULAS.md writes them; with
    ns_dtype bf16, X and each product rounded to bf16 as a bf16 matmul with fp32 accumulation
    writes it (torch's on bf16 tensors), the added term inside the rounding: M = bf16(X Xᵀ),
    P = bf16(c M M + b M), X = bf16(P X + a X)."""
    a, b, c = NS
    x = u / (u.norm() + 1e-7)
    transposed = u.shape[0] > u.shape[1]
    if transposed:
        x = x.t()
    if ns_dtype == "bf16":
        x = x.bfloat16()
        for _ in range(steps):
            m = (x.float() @ x.float().t()).bfloat16().float()
            p = (c * (m @ m) + b * m).bfloat16().float()
            x = (p @ x.float() + a * x.float()).bfloat16()
        x = x.double()
    else:
        for _ in range(steps):
            m = x @ x.t()
            x = a * x + (b * m + c * m @ m) @ x
    return x.t() if transposed else x


class MuonReference:
    """Muon on the layers' matrices, torch.optim.AdamW on the rest (the same lr, betas, eps
    and decay groups)."""

    def __init__(self, model, t, muon):
        self.t, self.muon = t, muon
        self.matrices = [(n, p) for n, p in model.named_parameters() if is_matrix(n)]
        rest = [(n, p) for n, p in model.named_parameters() if not is_matrix(n)]
        self.adamw = torch.optim.AdamW(
            [{"params": [p for n, p in rest if ref.is_decayed(n)],
              "weight_decay": t["weight_decay"]},
             {"params": [p for n, p in rest if not ref.is_decayed(n)], "weight_decay": 0.0}],
            lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["eps"])
        self.buf = {n: torch.zeros_like(p.t()) for n, p in self.matrices}

    def step(self, lr):
        for group in self.adamw.param_groups:
            group["lr"] = lr
        self.adamw.step()
        mu, wd = self.muon["momentum"], self.t["weight_decay"]
        with torch.no_grad():
            for name, p in self.matrices:
                g = p.grad.t()  # (out, in)
                self.buf[name] = mu * self.buf[name] + g
                u = g + mu * self.buf[name] if self.muon["nesterov"] else self.buf[name]
                o = orthogonalize(u, self.muon["ns_steps"], self.muon.get("ns_dtype", "fp32"))
                rows, cols = g.shape
                scale = (0.2 * math.sqrt(max(rows, cols)) if self.muon["scale"] == "moonlight"
                         else math.sqrt(max(1.0, rows / cols)))
                w = p.t()
                p.copy_((w - lr * wd * w - lr * scale * o).t())


def reference_losses(model, tokens, muon, t=base.TRAINING):
    optimizer = MuonReference(model, t, muon)
    losses = []
    for step in range(t["steps"]):
        lr = ref.lr_at(step, t["lr"], t["min_lr"], t["warmup_steps"], t["steps"], t["decay"])
        inputs, targets = ref.step_batch(tokens, step, base.GLOBAL_BATCH, base.SHAPE.seq_len)
        model.zero_grad(set_to_none=True)
        loss = model.loss(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"])
        optimizer.step(lr)
        losses.append(loss.item())
    return losses


def against_reference(tmp, trident, muon):
    label = f"scale {muon['scale']}, nesterov {muon['nesterov']}"
    model = base.reference_model(21)
    tokens = base.random_tokens(400, 22)
    weights, shard = os.path.join(tmp, "w.safetensors"), os.path.join(tmp, "t.bin")
    config, metrics = os.path.join(tmp, "muon.yaml"), os.path.join(tmp, f"m_{muon['scale']}.jsonl")
    ref.save_hf_weights(model, weights, with_prefix=True)
    ref.write_llmc_shard(shard, tokens)
    sections = base.config_sections(weights, shard, base.TRAINING, metrics)
    sections["optimizer"] = {"name": "muon"}
    ref.write_config(config, sections)
    overrides = [f"optimizer.muon.{k}={str(v).lower()}" for k, v in muon.items()]
    run([trident, "train", "--config", config] + [a for o in overrides for a in ("--set", o)])
    records = base.read_metrics(metrics)
    got = [r["loss"] for r in records]
    state_bytes(model, records[0] if records else None)
    want = reference_losses(model, tokens, muon)
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, want)) if len(got) == 10 else math.inf
    check(worst <= 1e-5, f"muon ({label}): 10 losses of one process within 1e-5 of PyTorch's "
                         f"(worst {worst:.2e}; last {got[-1] if got else None} vs {want[-1]:.6f})")


def ns_bf16(tmp, trident):
    """Part 4 (see the top of this file): one step's change of the layers' matrices, trident's
    against the reference's; returns the relative errors of bf16 against its reference and
    against fp32's."""
    muon = {"momentum": 0.95, "nesterov": True, "ns_steps": 5, "scale": "moonlight"}
    t = dict(base.TRAINING, steps=1)
    model = base.reference_model(21)
    tokens = base.random_tokens(400, 22)
    weights, shard = os.path.join(tmp, "w.safetensors"), os.path.join(tmp, "t.bin")
    ref.save_hf_weights(model, weights, with_prefix=True)
    ref.write_llmc_shard(shard, tokens)
    before = {n: p.detach().t().clone() for n, p in model.named_parameters() if is_matrix(n)}
    steps = {}
    for ns_dtype in ("fp32", "bf16"):
        config, ck = os.path.join(tmp, f"ns_{ns_dtype}.yaml"), os.path.join(tmp, f"ck_{ns_dtype}")
        sections = base.config_sections(weights, shard, t)
        sections["optimizer"] = {"name": "muon", "muon": dict(muon, ns_dtype=ns_dtype)}
        sections["checkpoint"] = {"dir": ck, "interval": 1}
        ref.write_config(config, sections)
        run([trident, "train", "--config", config])
        master = checkpoint_compare.load(os.path.join(ck, "step_000001"))[0]["master"]
        steps[ns_dtype] = {
            n: torch.tensor([checkpoint_compare.to_float(b) for b in master[n]],
                            dtype=torch.float64).reshape(w.shape) - w
            for n, w in before.items()}
    reference_losses(model, tokens, dict(muon, ns_dtype="bf16"), t)
    want = {n: p.detach().t() - before[n] for n, p in model.named_parameters() if is_matrix(n)}

    def error(got):
        diff = sum(float((got[n] - want[n]).norm() ** 2) for n in want)
        return math.sqrt(diff / sum(float(want[n].norm() ** 2) for n in want))

    return error(steps["bf16"]), error(steps["fp32"])


def state_bytes(model, record):
    """The optimizer state the allocator counts on one process: 8 bytes per parameter of a
    layer matrix (its fp32 master weight and momentum), 12 per other parameter of the buffer
    (master weight and Adam's two moments; the buffer's count from its fp32 parameters' bytes,
    the vocabulary padded)."""
    matrices = sum(p.numel() for n, p in model.named_parameters() if is_matrix(n))
    buffer = record["mem_params_bytes"] // 4 if record else 0
    want = 8 * matrices + 12 * (buffer - matrices)
    got = record["mem_optimizer_bytes"] if record else None
    check(got == want, f"muon state as allocated: {got} bytes = 8 x {matrices} matrix + 12 x "
                       f"{buffer - matrices} other parameters ({want})")


STATE = ("master", "momentum", "exp_avg", "exp_avg_sq")


def checkpoints(trident, muon, tmp, full):
    """Part 3 (see the top of this file); `full`: one process's 10 losses."""
    step5 = check_reshard(trident, muon, tmp, full, "muon", STATE)
    p, _ = resumed(trident, muon, tmp, "ck_adamw", step5, ["optimizer.name=adamw"],
                   expect_ok=False)
    lines = [x for x in p.stdout.splitlines() if "optimizer.name: muon in the checkpoint" in x]
    check(p.returncode != 0 and len(lines) == 1,
          f"muon checkpoint resumed with adamw: refused with one line ({lines})")
    adamw = tiny_run(tmp, [])
    run([trident, "train"] + adamw + ["--set", f"checkpoint.dir={tmp}/ck_a", "--set",
                                      "checkpoint.interval=5"])
    p, _ = resumed(trident, muon, tmp, "ck_to_muon", f"{tmp}/ck_a/step_000005", [],
                   expect_ok=False)
    check(p.returncode != 0, "adamw checkpoint resumed with muon: refused")
    p, _ = resumed(trident, muon, tmp, "ck_to_muon2", f"{tmp}/ck_a/step_000005",
                   ["checkpoint.allow_optimizer_change=true"])
    said = p.stdout.count("optimizer.name: adamw in the checkpoint's run, muon now")
    check(p.returncode == 0 and said == 1,
          f"adamw checkpoint resumed with muon under allow_optimizer_change: runs, said {said}x")


def by_name(*names):
    return [f for f in FAMILIES if f[0] in names]


def main():
    trident, _ = binaries_or_skip()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        against_reference(tmp, trident, {"momentum": 0.95, "nesterov": True, "ns_steps": 5,
                                         "scale": "moonlight"})
        against_reference(tmp, trident, {"momentum": 0.9, "nesterov": False, "ns_steps": 3,
                                         "scale": "spectral"})
        muon = tiny_run(tmp, ["optimizer.name=muon"])
        one = check_families(trident, muon, tmp, "muon")
        # bf16 with fp32 master weights where the layout keeps the arithmetic (M = 2 splits
        # the bf16 GEMMs: AdamW's losses there differ from one process's by 4e-5 too).
        check_families(trident, muon + ["--set", "training.precision=bf16"], tmp, "muon bf16",
                       families=by_name("D=2 ZeRO-1", "D=2 ZeRO-3", "P=2 1f1b"))
        grid = [("P=2 M=2 D=2 ZeRO-1", 8, ["parallel.pipeline=2", "parallel.tensor=2",
                                           "parallel.data=2", "parallel.zero_stage=1"])]
        check_families(trident, muon, tmp, "muon", one, families=grid)
        # Llama's seven matrices, k and v replicated over M = 2 (one key/value head).
        llama = tiny_run(tmp, ["optimizer.name=muon", "model.arch=llama", "model.kv_heads=1",
                               "model.tie_embeddings=false"])
        check_families(trident, llama, tmp, "muon llama", families=by_name("M=2", "D=2 ZeRO-3"))
        checkpoints(trident, muon, tmp, one)
        bf16, fp32 = ns_bf16(tmp, trident)
        check(bf16 <= 1e-2 < fp32, f"muon ns_dtype bf16: one step's change within 1e-2 of the bf16 "
                                   f"reference ({bf16:.2e}), fp32's beyond it ({fp32:.2e})")
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
