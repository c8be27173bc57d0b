"""The part-level tests' harness: one part of the model on its own (tests/tools/part_check.cpp,
built as the model builds it), on inputs written here, on one process and split over M = 2
tensor ranks (with and without sequence parallelism) under mpirun; its output, its input's
gradient and every gradient of its tensors held against a PyTorch layer of the same part
(float64, autograd), and the split runs against the whole.

A part is a PartCase: its name for the tool, its family, its tensors (whole, under the names
its kind declares) and inputs, and its PyTorch layer. A new part's first test is one more case
(tests/python/test_parts.py).
"""
import os
import shutil
import subprocess
import tempfile

import numpy as np
import torch

import gpt2_reference as ref

TOLERANCE = 1e-5  # max |a - b| / max |b|, per tensor

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


class PartCase:
    """`forward(params, inputs)`: the PyTorch layer on float64 tensors, returning the output (or
    the loss, for a part that ends in one); `outputs` the names of what is compared."""

    def __init__(self, part, arch, shape, params, inputs, forward, loss=False, label=""):
        self.part, self.arch, self.shape, self.label = part, arch, shape, label
        self.params, self.inputs, self.forward, self.loss = params, inputs, forward, loss


def rel(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    if a.size != b.size:
        return float("inf")
    scale = max(float(np.abs(b).max(initial=0.0)), 1e-30)
    return float(np.abs(a - b).max(initial=0.0)) / scale


def reference(case):
    """The PyTorch results under the tool's names: y (or loss), dx, grad/NAME."""
    params = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True)
              for k, v in case.params.items()}
    x = case.inputs.get("x")
    x = torch.tensor(x, dtype=torch.float64, requires_grad=True) if x is not None else None
    out = case.forward(params, x, case.inputs)
    results = {}
    if case.loss:
        out.backward()
        results["loss"] = out.detach().numpy()
    else:
        (out * torch.tensor(case.inputs["dy"], dtype=torch.float64)).sum().backward()
        results["y"] = out.detach().numpy()
    if x is not None:
        results["dx"] = x.grad.numpy()
    for name, p in params.items():  # a tensor that does not train has a zero gradient
        results["grad/" + name] = (p.grad if p.grad is not None else torch.zeros_like(p)).numpy()
    return results


def run_tool(tool, case, directory, ranks=1, sequence_parallel=False, tp_overlap=False):
    """The tool's results: name -> flat float32 array."""
    inputs = {k: np.asarray(v, np.float32) for k, v in {**case.params, **case.inputs}.items()
              if k != "dy" or not case.loss}
    if case.loss:
        inputs["dy"] = np.zeros(1, np.float32)
    src = os.path.join(directory, "in.safetensors")
    out = os.path.join(directory,
                       f"out{ranks}{int(sequence_parallel)}{int(tp_overlap)}.safetensors")
    ref.write_safetensors(src, {k: v.reshape(-1) for k, v in inputs.items()})
    s = case.shape
    cmd = [tool, "--part", case.part, "--arch", case.arch, "--input", src, "--output", out,
           "--vocab", str(s.get("vocab", 100)), "--seq", str(s["seq"]), "--hidden", str(s["hidden"]),
           "--heads", str(s["heads"]), "--kv-heads", str(s.get("kv_heads", s["heads"])),
           "--ffn", str(s["ffn"]), "--batch", str(s["batch"]),
           "--sequence-parallel", "true" if sequence_parallel else "false",
           "--tp-overlap", "true" if tp_overlap else "false"]
    for key, value in s.items():  # mlp:moe's settings: moe_experts -> --moe-experts
        if key.startswith("moe_"):
            cmd += ["--" + key.replace("_", "-"), str(value).lower()]
    if ranks > 1:
        cmd = [shutil.which("mpirun"), "--oversubscribe", "-np", str(ranks)] + cmd
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    if done.returncode != 0:
        check(False, f"{case.part}: {' '.join(cmd)} failed:\n{done.stdout}{done.stderr}")
        return None
    return {k: np.asarray(v) for k, v in ref.read_safetensors(out)[0].items()}


def compare(got, want, what):
    """Each of `want`'s results against `got`'s (a vocabulary's padded rows beyond want's
    dropped); the worst relative difference, and its name."""
    worst = (0.0, "")
    for name, value in want.items():
        if name not in got:
            return float("inf"), f"{name} missing"
        g = np.asarray(got[name]).ravel()[:np.asarray(value).size]
        worst = max(worst, (rel(g, value), name))
    return worst


def check_part(tool, case):
    """The part on one process against PyTorch, and at M = 2 (with sequence parallelism, and
    for a linear with its exchanges overlapped too: parallel.tp_overlap) against one
    process."""
    what = f"{case.part} ({case.arch}{', ' + case.label if case.label else ''})"
    with tempfile.TemporaryDirectory() as tmp:
        want = reference(case)
        one = run_tool(tool, case, tmp)
        if one is None:
            return
        worst = compare(one, want, "PyTorch")
        check(worst[0] <= TOLERANCE,
              f"{what}: forward, input and parameter gradients within {TOLERANCE} of "
              f"PyTorch's ({len(want)} tensors; worst {worst[0]:.2e}, {worst[1]})")
        whole = {k: v for k, v in one.items() if k in want}
        splits = [(False, False), (True, False)]
        if case.part.startswith("linear:"):
            splits.append((True, True))
        for sp, overlap in splits:
            split = run_tool(tool, case, tmp, ranks=2, sequence_parallel=sp, tp_overlap=overlap)
            if split is None:
                return
            worst = compare(split, whole, "one process")
            label = " +SP" if sp else ""
            label += " +tp_overlap" if overlap else ""
            check(worst[0] <= TOLERANCE,
                  f"{what}: M=2{label} within {TOLERANCE} of one process "
                  f"(worst {worst[0]:.2e}, {worst[1]})")
