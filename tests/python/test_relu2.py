#!/usr/bin/python3
"""`model.mlp: relu2` (model/relu2_mlp.cpp: fc, relu(x)², proj, no biases, in GPT-2's layer)
against an independent PyTorch reference, and on every layout family:

1. the loss and every gradient of one global batch (trident_model_dump, from a checkpoint of
   5 trained steps) within 1e-5 relative (max|a-b| / max|b| per tensor) of a float64 PyTorch
   GPT-2 whose MLP is relu(x @ fcᵀ).square() @ projᵀ;
2. the losses of 10 training steps on every layout family (layout_families.py) within 1e-5 of
   one process's.

Exit 77 (skipped) without torch and numpy or mpirun.
"""
import os
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torch.nn as nn
except ImportError as e:
    print(f"SKIP: the PyTorch reference needs torch and numpy ({e})")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference as ref  # noqa: E402
from layout_families import check_families, curve, sets  # noqa: E402
from mpi_harness import (binaries_or_skip, check, failures, read_safetensors, run,  # noqa: E402
                         tiny_run, worst_tensor_diff)

# tiny_run's model (vocabulary 300, sequence 16, hidden 32, 4 heads, ffn 128) with 4 layers.
SHAPE = ref.GPTShape(vocab=300, seq_len=16, layers=4, hidden=32, heads=4, ffn=128)
RELU2 = ["model.mlp=relu2", "model.layers=4"]


class Linear(nn.Module):
    """y = x Wᵀ, W (out, in) as Trident's layout holds it; no bias."""

    def __init__(self, fan_in, fan_out):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(fan_out, fan_in, dtype=torch.float64))

    def forward(self, x):
        return x @ self.weight.t()


class Relu2MLP(nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.fc = Linear(shape.hidden, shape.ffn)
        self.proj = Linear(shape.ffn, shape.hidden)

    def forward(self, x):
        return self.proj(torch.relu(self.fc(x)).square())


def reference_model(params):
    """GPT-2 with the ReLU² MLP, its weights those of a Trident checkpoint's one shard (our
    names; the attention's Conv1D weights transposed, wte's padded rows dropped)."""
    model = ref.GPT2Reference(SHAPE)
    for block in model.h:
        block.mlp = Relu2MLP(SHAPE)
    with torch.no_grad():
        for name, p in model.named_parameters():
            value = torch.tensor(np.asarray(params["param/" + name]), dtype=torch.float64)
            if ".attn." in name and p.dim() == 2:  # Conv1D [in, out] of our [out, in]
                value = value.reshape(p.shape[1], p.shape[0]).t()
            p.copy_(value.reshape(-1)[:p.numel()].reshape(p.shape))
    return model


def reference_gradients(model, tokens):
    """The loss and gradients of step 0's global batch, under our names and layout."""
    inputs, targets = ref.step_batch(tokens, 0, 4, SHAPE.seq_len)
    loss = model.loss(inputs, targets)
    loss.backward()
    grads = {"loss": [loss.item()]}
    for name, p in model.named_parameters():
        g = p.grad.t() if ".attn." in name and p.dim() == 2 else p.grad
        grads[name] = g.contiguous().reshape(-1).tolist()
    return grads


def main():
    trident, dump = binaries_or_skip()
    with tempfile.TemporaryDirectory() as tmp:
        base = tiny_run(tmp, RELU2)
        metrics, ck = os.path.join(tmp, "m1.jsonl"), os.path.join(tmp, "ck")
        run([trident, "train"] + base + sets([f"logging.metrics={metrics}",
                                              f"checkpoint.dir={ck}", "checkpoint.interval=5"]))
        # 1. One global batch against PyTorch, from the weights of step 5.
        step5 = os.path.join(ck, "step_000005")
        grads = os.path.join(tmp, "g.safetensors")
        run([dump] + base + sets([f"model.init_from={step5}"]) + ["--output", grads])
        got = read_safetensors(grads)
        want = reference_gradients(
            reference_model(read_safetensors(os.path.join(step5, "pp0_tp0_dp0.safetensors"))),
            ref.read_llmc_shard(os.path.join(tmp, "train.bin")))
        got = {k: list(v)[:len(want[k])] if k in want else v for k, v in got.items()}
        worst = worst_tensor_diff(got, want)
        check(set(got) == set(want) and worst[0] <= 1e-5,
              f"relu2: loss and {len(want) - 1} gradients of one batch within 1e-5 of PyTorch's "
              f"(worst {worst[0]:.2e}, {worst[1]})")
        # 2. Every layout family against one process.
        check_families(trident, base, tmp, "relu2", curve(metrics))
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
