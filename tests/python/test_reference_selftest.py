# Self-test of the PyTorch reference (gpt2_reference.py), run before trusting it as the judge of
# Trident: the float64 GPT's gradients against finite differences (torch.autograd.gradcheck), its
# hand-written math against torch's built-in layers, the safetensors and llm.c shard round trips,
# the sampling windows and the LR schedule. Needs no Trident binary; the flags ctest passes
# (--trident, --tools-dir) are accepted and ignored.
#
# Exit status: 0 all checks passed, 1 a check failed, 77 skipped (torch or numpy missing).

import argparse
import json
import math
import os
import struct
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch.nn.utils.stateless import functional_call
except ImportError as e:
    print(f"SKIP: the PyTorch reference needs torch and numpy ({e}); "
          f"install Debian's python3-torch and run with /usr/bin/python3")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference as ref  # noqa: E402

failures = []


def check(name, ok, detail):
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    if not ok:
        failures.append(name)


def builtin_loss(model, params, inputs, targets):
    """The same GPT from torch's own layers (F.layer_norm, F.gelu, F.cross_entropy, softmax):
    an implementation of the forward pass that shares no arithmetic with GPT2Reference."""
    shape = model.shape
    C, NH = shape.hidden, shape.heads
    B, T = inputs.shape
    x = F.embedding(inputs, params["wte.weight"]) + params["wpe.weight"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(shape.layers):
        p = lambda n: params[f"h.{l}.{n}"]  # noqa: E731
        a = F.layer_norm(x, (C,), p("ln_1.weight"), p("ln_1.bias"), 1e-5)
        qkv = torch.addmm(p("attn.c_attn.bias"), a.reshape(-1, C), p("attn.c_attn.weight"))
        q, k, v = qkv.reshape(B, T, 3, NH, C // NH).permute(2, 0, 3, 1, 4)
        att = torch.einsum("bhqd,bhkd->bhqk", q, k) * (C // NH) ** -0.5
        att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = torch.einsum("bhqk,bhkd->bqhd", att, v).reshape(B * T, C)
        x = x + torch.addmm(p("attn.c_proj.bias"), y, p("attn.c_proj.weight")).reshape(B, T, C)
        m = F.layer_norm(x, (C,), p("ln_2.weight"), p("ln_2.bias"), 1e-5)
        m = F.gelu(F.linear(m, p("mlp.c_fc.weight").t(), p("mlp.c_fc.bias")), approximate="tanh")
        x = x + F.linear(m, p("mlp.c_proj.weight").t(), p("mlp.c_proj.bias"))
    x = F.layer_norm(x, (C,), params["ln_f.weight"], params["ln_f.bias"], 1e-5)
    logits = F.linear(x, params["wte.weight"])
    return F.cross_entropy(logits.reshape(-1, shape.vocab), targets.reshape(-1))


def test_gradcheck():
    shape = ref.GPTShape(vocab=7, seq_len=5, layers=2, hidden=8, heads=2, ffn=12)
    model = ref.GPT2Reference(shape)
    ref.random_init(model, seed=3, std=0.3)  # large weights: every path clearly non-linear
    names = [n for n, _ in model.named_parameters()]
    generator = torch.Generator().manual_seed(5)
    inputs = torch.randint(0, shape.vocab, (2, shape.seq_len), generator=generator)
    targets = torch.randint(0, shape.vocab, (2, shape.seq_len), generator=generator)

    def loss_of(*tensors):
        return _loss_with(model, dict(zip(names, tensors)), inputs, targets)

    leaves = tuple(p.detach().clone().requires_grad_(True) for p in model.parameters())
    ok = torch.autograd.gradcheck(loss_of, leaves, eps=1e-6, atol=1e-7, rtol=1e-5,
                                  raise_exception=False)
    check("gradcheck", ok, f"float64 GPT ({len(leaves)} tensors, "
          f"{sum(p.numel() for p in leaves)} values) against finite differences")


def _loss_with(model, params, inputs, targets):
    # functional_call dispatches to forward(); ours is named loss(), so swap it in.
    original = model.forward
    model.forward = model.loss
    try:
        return functional_call(model, params, (inputs, targets))
    finally:
        model.forward = original


def test_against_builtin_layers():
    shape = ref.GPTShape(vocab=50, seq_len=9, layers=2, hidden=16, heads=4, ffn=40)
    model = ref.GPT2Reference(shape)
    ref.random_init(model, seed=11)
    generator = torch.Generator().manual_seed(12)
    inputs = torch.randint(0, shape.vocab, (3, shape.seq_len), generator=generator)
    targets = torch.randint(0, shape.vocab, (3, shape.seq_len), generator=generator)

    loss = model.loss(inputs, targets)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    params = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    other = builtin_loss(model, params, inputs, targets)
    other_grads = torch.autograd.grad(other, list(params.values()))

    loss_err = abs(loss.item() - other.item()) / abs(other.item())
    grad_err = max(ref.relative_error(a.numpy(), b.numpy())
                   for a, b in zip(grads, other_grads))
    check("builtin-layers loss", loss_err < 1e-12, f"max rel err {loss_err:.3e} (limit 1e-12)")
    check("builtin-layers grads", grad_err < 1e-10, f"max rel err {grad_err:.3e} (limit 1e-10)")


def test_safetensors_round_trip(tmp):
    rng = np.random.default_rng(0)
    tensors = {
        "transformer.h.0.attn.c_attn.weight": rng.standard_normal((4, 12)).astype(np.float32),
        "loss": np.array([2.5], dtype=np.float32),
        "scalar64": np.array(3.25, dtype=np.float64),
        "ids": np.arange(7, dtype=np.int32),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }
    path = os.path.join(tmp, "round_trip.safetensors")
    ref.write_safetensors(path, tensors, metadata={"format": "pt"})
    back, metadata = ref.read_safetensors(path)
    same = set(back) == set(tensors) and all(
        back[n].dtype == tensors[n].dtype and back[n].shape == tensors[n].shape
        and np.array_equal(back[n], tensors[n]) for n in tensors)
    check("safetensors round trip", same and metadata == {"format": "pt"},
          f"{len(tensors)} tensors (F32, F64, I32, empty) and metadata read back bit-exact")

    # The layout itself: header length, then JSON, then data offsets that tile the data.
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    spans = sorted(tuple(v["data_offsets"]) for k, v in header.items() if k != "__metadata__")
    tiled = spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    check("safetensors layout", tiled and spans[-1][1] == len(raw) - 8 - n,
          f"header {n} bytes, data {len(raw) - 8 - n} bytes, offsets contiguous")

    # BF16 is read by widening: 0x3FC0 is 1.5.
    bf16 = os.path.join(tmp, "bf16.safetensors")
    head = json.dumps({"x": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}).encode()
    with open(bf16, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + struct.pack("<HH", 0x3FC0, 0xC000))
    got, _ = ref.read_safetensors(bf16)
    check("safetensors BF16", np.array_equal(got["x"], np.array([1.5, -2.0], np.float32)),
          f"read {got['x'].tolist()}")


def test_shard_and_sampling(tmp):
    tokens = np.arange(50) % 37
    path = os.path.join(tmp, "tokens.bin")
    ref.write_llmc_shard(path, tokens)
    size = os.path.getsize(path)
    back = ref.read_llmc_shard(path)
    check("llm.c shard", size == 1024 + 2 * 50 and np.array_equal(back, tokens),
          f"{size} bytes, tokens read back")

    # N = 50, T = 8: W = 6 windows, so sample 6 wraps to window 0 and sample 7 to window 1.
    x, y = ref.step_batch(np.arange(50), step=1, global_batch=4, seq_len=8)
    starts = x[:, 0].tolist()
    ok = starts == [32, 40, 0, 8] and torch.equal(y, x + 1)
    check("sampling windows", ok, f"step 1 of B=4, T=8 starts at {starts} (want [32, 40, 0, 8])")


def test_lr_schedule():
    lr = lambda s, d: ref.lr_at(s, 1.0, 0.1, 4, 14, d)  # noqa: E731
    ok = (lr(0, "cosine") == 0.25 and lr(3, "cosine") == 1.0 and lr(4, "cosine") == 1.0
          and math.isclose(lr(9, "cosine"), 0.55) and math.isclose(lr(14, "cosine"), 0.1)
          and math.isclose(lr(9, "linear"), 0.55) and lr(13, "constant") == 1.0)
    check("lr schedule", ok, "warmup (s+1)/w, cosine and linear reach the midpoint and min_lr")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trident")
    parser.add_argument("--tools-dir")
    parser.parse_args()
    torch.set_num_threads(1)

    test_gradcheck()
    test_against_builtin_layers()
    with tempfile.TemporaryDirectory() as tmp:
        test_safetensors_round_trip(tmp)
        test_shard_and_sampling(tmp)
    test_lr_schedule()

    if failures:
        print(f"FAILED: {', '.join(failures)}")
        return 1
    print("all reference self-tests passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
