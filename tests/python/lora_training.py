# What the LoRA tests (test_lora.py, test_llama_lora.py) share: the adapters' AdamW steps in
# PyTorch as Trident takes them (its learning-rate schedule, clipping by the global norm), a
# run's metrics records, and the worst relative difference of two curves.
import json

import torch

import gpt2_reference as common


def reference_training(model, params, tokens, training, seq_len, loss=None):
    """training["steps"] AdamW steps of `params` (the adapters) on `model`'s loss over the
    tokens in order (or on loss(inputs, targets): (the loss logged, the loss trained)); returns
    (loss logged, gradient norm before clipping) per step."""
    t = training
    optimizer = torch.optim.AdamW(params, lr=t["lr"], betas=(t["beta1"], t["beta2"]),
                                  eps=t["eps"], weight_decay=t["weight_decay"])
    history = []
    for step in range(t["steps"]):
        lr = common.lr_at(step, t["lr"], t["min_lr"], t["warmup_steps"], t["steps"], t["decay"])
        for group in optimizer.param_groups:
            group["lr"] = lr
        inputs, targets = common.step_batch(tokens, step, t["global_batch"], seq_len)
        optimizer.zero_grad(set_to_none=True)
        logged, trained = loss(inputs, targets) if loss else (model.loss(inputs, targets),) * 2
        trained.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, t["grad_clip"])
        optimizer.step()
        history.append((logged.item(), norm.item()))
    return history


def curve(path):
    """The records of a metrics file that hold a training step's loss."""
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [r for r in records if "loss" in r]


def worst_rel(got, want):
    """The largest relative difference; infinite where the lengths differ (or are none)."""
    if len(got) != len(want) or not want:
        return float("inf")
    return max(abs(g - w) / abs(w) for g, w in zip(got, want))
