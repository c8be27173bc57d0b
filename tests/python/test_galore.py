#!/usr/bin/python3
"""`optimizer.name: galore` (src/optim/galore.h) against the PyTorch reference of
galore_reference.py, and on every layout family:

1. ten steps of one process (warmup, cosine decay, weight decay, clipping) against a float64
   PyTorch GPT-2 trained by GaloreReference (the projector from torch.linalg.svd, the
   projected moments torch.optim.Adam's), crossing projector updates (update_gap 4: updates 1,
   5 and 9), matrices taller and wider than long (c_fc, mlp c_proj) and a rank above
   min(m, n); losses within 1e-5 relative, step by step; the optimizer state as the allocator
   counts it is the formula's (4 bytes per parameter of master weights, Adam's 8 on the rest,
   per matrix 2·r·max(m, n)·4 + the projector's r·n or m·r·4) and below AdamW's;
2. the losses of 10 training steps on every layout family (layout_families.py), bf16 with fp32
   master weights on D=2 (ZeRO-1) and P=2, a 2 x 2 x 2 x 1 grid, and llama (k and v replicated
   over M = 2; ZeRO-3), each within 1e-5 of one process's;
3. checkpoints: one process's step-5 checkpoint resumed on M=2 x D=2 (ZeRO-1) gives the
   uninterrupted run's losses within 1e-5 and, at step 10, its master weights, Adam moments,
   projected moments and projectors element by element (checkpoint_compare.py, relative to each
   tensor's largest magnitude, 1e-4), and a D=4 hybrid-sharded run's projected moments and
   projectors are one process's (each matrix's written once); resuming with another
   optimizer.name or optimizer.galore.rank is refused with one line, and checkpoint.allow_optimizer_change lets an AdamW
   checkpoint go on with GaLore, said once.

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
import gpt2_reference as ref  # noqa: E402
import test_gpt2_reference as base  # noqa: E402
from galore_reference import GaloreReference, is_matrix  # noqa: E402
from layout_families import FAMILIES, check_families  # noqa: E402
from mpi_harness import (binaries_or_skip, check, checkpoints_differ, failures,  # noqa: E402
                         run, tiny_run)
from optimizer_resume import check_reshard, resumed  # noqa: E402


def reference_losses(model, tokens, galore):
    t = base.TRAINING
    optimizer = GaloreReference(model, t, ref.is_decayed, galore)
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


def state_bytes(model, record, galore, below):
    """The optimizer state the allocator counts on one process (see the top of this file);
    the buffer's count from its fp32 parameters' bytes, the vocabulary padded. `below`: a
    rank under every matrix's min(m, n), whose state is below AdamW's."""
    buffer = record["mem_params_bytes"] // 4 if record else 0
    matrices = [p.shape for n, p in model.named_parameters() if is_matrix(n)]
    inside = sum(a * b for a, b in matrices)
    per_matrix = 0
    for cols, rows in matrices:  # Conv1D (in, out)
        r = min(galore["rank"], rows, cols)
        per_matrix += 4 * (2 * r * max(rows, cols) + (r * cols if rows >= cols else rows * r))
    want = 4 * buffer + 8 * (buffer - inside) + per_matrix
    got = record["mem_optimizer_bytes"] if record else None
    check(got == want and (got < 12 * buffer) == below,
          f"galore state as allocated (rank {galore['rank']}): {got} bytes = 4 x {buffer} "
          f"masters + 8 x {buffer - inside} other + {per_matrix} per matrix ({want}), "
          f"{(got or 0) / (12 * buffer):.3f} of AdamW's {12 * buffer}")


def against_reference(tmp, trident, galore, below):
    label = ", ".join(f"{k} {v}" for k, v in galore.items())
    model = base.reference_model(31)
    tokens = base.random_tokens(400, 32)
    weights, shard = os.path.join(tmp, "w.safetensors"), os.path.join(tmp, "t.bin")
    config, metrics = os.path.join(tmp, "galore.yaml"), os.path.join(tmp, "g.jsonl")
    ref.save_hf_weights(model, weights, with_prefix=True)
    ref.write_llmc_shard(shard, tokens)
    sections = base.config_sections(weights, shard, base.TRAINING, metrics)
    sections["optimizer"] = {"name": "galore", "galore": galore}
    ref.write_config(config, sections)
    run([trident, "train", "--config", config])
    records = base.read_metrics(metrics)
    got = [r["loss"] for r in records]
    state_bytes(model, records[0] if records else None, galore, below)
    want = reference_losses(model, tokens, galore)
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, want)) if len(got) == 10 else math.inf
    check(worst <= 1e-5, f"galore ({label}): 10 losses of one process within 1e-5 of PyTorch's "
                         f"(worst {worst:.2e}; last {got[-1] if got else None} vs {want[-1]:.6f})")
    return worst


MATRIX_STATE = ("MATRIX/exp_avg", "MATRIX/exp_avg_sq", "MATRIX/projector")
STATE = ("master", "exp_avg", "exp_avg_sq") + MATRIX_STATE


def checkpoints(trident, galore, tmp, full):
    """Part 3 (see the top of this file); `full`: one process's 10 losses."""
    step5 = check_reshard(trident, galore, tmp, full, "galore", STATE,
                          " (master weights, Adam's moments, projected moments, projectors)")
    p, _ = resumed(trident, galore, tmp, "ck_muon", step5, ["optimizer.name=muon"],
                   expect_ok=False)
    lines = [x for x in p.stdout.splitlines() if "optimizer.name: galore in the checkpoint" in x]
    check(p.returncode != 0 and len(lines) == 1,
          f"galore checkpoint resumed with muon: refused with one line ({lines})")
    p, _ = resumed(trident, galore, tmp, "ck_rank4", step5,
                   ["optimizer.galore.rank=4", "parallel.data=2"], ranks=2, expect_ok=False)
    lines = [x for x in p.stdout.splitlines() if "optimizer.galore.rank differs" in x]
    check(p.returncode != 0 and len(lines) == 1,
          f"galore checkpoint resumed with another rank on D=2: refused with one line ({lines})")
    adamw = tiny_run(tmp, [])
    run([trident, "train"] + adamw + ["--set", f"checkpoint.dir={tmp}/ck_a", "--set",
                                      "checkpoint.interval=5"])
    p, _ = resumed(trident, galore, tmp, "ck_to_galore", f"{tmp}/ck_a/step_000005",
                   ["checkpoint.allow_optimizer_change=true"])
    said = p.stdout.count("optimizer.name: adamw in the checkpoint's run, galore now")
    check(p.returncode == 0 and said == 1,
          f"adamw checkpoint resumed with galore under allow_optimizer_change: runs, said {said}x")


def hybrid_checkpoint(trident, galore, tmp):
    """Hybrid sharding's shard groups each hold every matrix's state: the first alone writes
    it, and its per-matrix state is one process's element by element (global batch 8 both)."""
    batch = ["training.global_batch=8", "checkpoint.interval=10"]
    one, hybrid = os.path.join(tmp, "ck_one8"), os.path.join(tmp, "ck_hybrid")
    run([trident, "train"] + galore + [a for o in batch + [f"checkpoint.dir={one}"]
                                       for a in ("--set", o)])
    grid = ["parallel.data=4", "parallel.zero_stage=3", "parallel.data_shard=2"]
    run([trident, "train"] + galore + [a for o in batch + grid + [f"checkpoint.dir={hybrid}"]
                                       for a in ("--set", o)], ranks=4)
    try:
        differ = checkpoints_differ(os.path.join(one, "step_000010"),
                                    os.path.join(hybrid, "step_000010"), 1e-4, MATRIX_STATE)
    except ValueError as e:
        differ = str(e)
    check(differ is None, f"galore state of D=4 hybrid shard 2 at step 10, written once, "
                          f"element by element as one process's: {differ or 'the same'}")


def by_name(*names):
    return [f for f in FAMILIES if f[0] in names]


def main():
    trident, _ = binaries_or_skip()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        against_reference(tmp, trident, {"rank": 8, "update_gap": 4, "scale": 0.25}, True)
        against_reference(tmp, trident, {"rank": 40, "update_gap": 3, "scale": 1.0}, False)
        galore = tiny_run(tmp, ["optimizer.name=galore", "optimizer.galore.rank=8",
                                "optimizer.galore.update_gap=4"])
        one = check_families(trident, galore, tmp, "galore")
        check_families(trident, galore + ["--set", "training.precision=bf16"], tmp, "galore bf16",
                       families=by_name("D=2 ZeRO-1", "P=2 1f1b"))
        grid = [("P=2 M=2 D=2 ZeRO-1", 8, ["parallel.pipeline=2", "parallel.tensor=2",
                                           "parallel.data=2", "parallel.zero_stage=1"])]
        check_families(trident, galore, tmp, "galore", one, families=grid)
        # Llama's seven matrices, k and v replicated over M = 2 (one key/value head).
        llama = tiny_run(tmp, ["optimizer.name=galore", "optimizer.galore.rank=8",
                               "optimizer.galore.update_gap=4", "model.arch=llama",
                               "model.kv_heads=1", "model.tie_embeddings=false"])
        check_families(trident, llama, tmp, "galore llama", families=by_name("M=2", "D=2 ZeRO-3"))
        checkpoints(trident, galore, tmp, one)
        hybrid_checkpoint(trident, galore, tmp)
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
