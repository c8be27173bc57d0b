#!/usr/bin/python3
"""Two Trident checkpoints compared tensor by tensor, element by element.

A checkpoint directory holds manifest.json and one safetensors shard per rank (see
src/train/checkpoint.h for what a shard holds). This reader is written from the formats
alone: the safetensors layout (an 8-byte little-endian header length, a JSON header of
dtype, shape and data_offsets per tensor, then the data) and the tensor-parallel splits that
model/param_layout.h documents (Megatron's: vocabulary rows of wte, q/k/v rows of c_attn,
rows of c_fc, columns of the two c_proj weights, the rest replicated; a llama model's rows of
embed_tokens, lm_head, q_proj, gate_proj and up_proj, columns of o_proj and down_proj, and rows
of k_proj and v_proj by key/value head, each head's rows held whole by M / kv_heads consecutive
ranks when there are fewer heads than ranks; a mixture of experts' experts and shared experts
split as the dense MLP, its router whole). A LoRA checkpoint holds the adapters alone: A
(rank × in) split by columns where its linear is split by columns, else whole; B (out × rank)
split by rows as its linear's rows, else whole. It shares no code with the C++ reader, so a fault
in that reader cannot hide here.

Each checkpoint is put back together into whole tensors of each kind it holds: "param" (the
model's weights as the run held them), "master" (fp32 master weights) and the optimizer's state
by its names (AdamW's "exp_avg" and "exp_avg_sq", Muon's "momentum" too), every element of every tensor written by exactly one shard; the
state an optimizer keeps per whole matrix (GaLore's) is held whole under "MATRIX/KIND"
(MATRIX/exp_avg, MATRIX/exp_avg_sq, MATRIX/projector), each matrix's written once. compare() names
the first tensor and element that differs, bitwise or beyond a relative tolerance.

Standard library only. As a script: checkpoint_compare.py A B [--rtol X] (bitwise without
--rtol) exits 0 when they match, 1 with the first difference.
"""
import argparse
import array
import json
import os
import struct
import sys

KINDS = ("param", "master", "exp_avg", "exp_avg_sq")
# Bytes per element and how to widen each dtype to fp32 bits.
DTYPES = {"F32": 4, "BF16": 2, "F16": 2}


def read_safetensors(path):
    """{name: (dtype, shape, raw bytes)}, every length checked against the file."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: {len(data)} bytes, too short for a header length")
    n = struct.unpack("<Q", data[:8])[0]
    if 8 + n > len(data):
        raise ValueError(f"{path}: header of {n} bytes runs past the end ({len(data)} bytes)")
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    tensors = {}
    covered = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape = info["dtype"], info["shape"]
        begin, end = info["data_offsets"]
        count = 1
        for d in shape:
            count *= d
        if dtype not in DTYPES or not 0 <= begin <= end <= len(body) \
                or end - begin != count * DTYPES[dtype]:
            raise ValueError(f"{path}: tensor {name}: {dtype} {shape} does not fit bytes "
                             f"{begin}..{end} of {len(body)}")
        covered += end - begin
        tensors[name] = (dtype, shape, body[begin:end])
    if covered != len(body):
        raise ValueError(f"{path}: tensors cover {covered} of {len(body)} data bytes")
    return tensors


def as_f32_bits(dtype, raw):
    """The elements as fp32 bit patterns (uint32), 16-bit kinds widened exactly."""
    if dtype == "F32":
        return array.array("I", raw)
    halves = array.array("H", raw)
    if dtype == "BF16":
        return array.array("I", (h << 16 for h in halves))
    return array.array("I", (struct.unpack("<I", struct.pack("<f", struct.unpack(
        "<e", struct.pack("<H", h))[0]))[0] for h in halves))


def adapted(name):
    """The linear an adapter's factor (lora_A, lora_B) belongs to: its weight's name."""
    return name.replace(".lora_A.", ".").replace(".lora_B.", ".")


def full_shape(name, model, lora_rank=0):
    """The whole tensor's shape, from the model's sizes in the manifest: an adapter's A
    (r, in) and B (out, r) of its linear W (out, in)."""
    if ".lora_" in name:
        out, inp = full_shape(adapted(name), model)
        return [lora_rank, inp] if ".lora_A." in name else [out, lora_rank]
    c, f, t, vp = model["hidden"], model["ffn_hidden"], model["seq_len"], model["padded_vocab"]
    if name in ("wte.weight", "embed_tokens.weight", "lm_head.weight"):
        return [vp, c]
    if name == "wpe.weight":
        return [t, c]
    kv = c // model["heads"] * model.get("kv_heads", model["heads"])
    leaf = name.split(".", 2)[-1] if name.startswith(("h.", "layers.")) else name
    moe = model.get("moe")
    if moe and leaf.startswith(("mlp.experts.", "mlp.shared_experts.", "mlp.gate.")):
        return moe_shape(leaf, moe, c)
    return {"attn.c_attn.weight": [3 * c, c], "attn.c_attn.bias": [3 * c],
            "attn.c_proj.weight": [c, c], "mlp.c_fc.weight": [f, c], "mlp.c_fc.bias": [f],
            "mlp.c_proj.weight": [c, f], "self_attn.q_proj.weight": [c, c],
            "self_attn.k_proj.weight": [kv, c], "self_attn.v_proj.weight": [kv, c],
            "self_attn.o_proj.weight": [c, c], "mlp.gate_proj.weight": [f, c],
            "mlp.up_proj.weight": [f, c], "mlp.down_proj.weight": [c, f]}.get(leaf, [c])


def moe_shape(leaf, moe, c):
    """A mixture of experts' tensor (the manifest's model.moe): the router (experts, hidden)
    and its bias (experts), each expert's SwiGLU of width F = moe.ffn_hidden, the shared
    experts' one of width shared_experts·F."""
    n, f = moe["experts"], moe["ffn_hidden"]
    if leaf.startswith("mlp.gate."):
        return [n, c] if leaf == "mlp.gate.weight" else [n]
    if leaf.startswith("mlp.shared_experts."):
        f *= moe["shared_experts"]
    return [c, f] if leaf.endswith("down_proj.weight") else [f, c]


ROWS = ("wte.weight", "embed_tokens.weight", "lm_head.weight", "mlp.c_fc.weight", "mlp.c_fc.bias",
        "q_proj.weight", "gate_proj.weight", "up_proj.weight")
COLUMNS = ("attn.c_proj.weight", "mlp.c_proj.weight", "o_proj.weight", "down_proj.weight")


def split_of(name):
    # Adapters follow their linear's split: beside a column-parallel W, A whole and B split
    # like W's rows; beside a row-parallel W, A split by columns and B whole.
    if ".lora_" in name:
        split = split_of(adapted(name))
        if ".lora_A." in name:
            return "columns" if split == "columns" else "replicated"
        return "replicated" if split == "columns" else split
    if name.endswith(ROWS):
        return "rows"
    if name.endswith(("k_proj.weight", "v_proj.weight")):
        return "kv_rows"
    if name.endswith("attn.c_attn.weight") or name.endswith("attn.c_attn.bias"):
        return "qkv_rows"
    if name.endswith(COLUMNS):
        return "columns"
    return "replicated"


def slices(name, model, tensors):
    """How many distinct slices tensor ranks hold of the tensor (1: whole on every rank)."""
    split = split_of(name) if tensors > 1 else "replicated"
    if split == "replicated":
        return 1
    if split == "kv_rows":
        return min(tensors, model.get("kv_heads", model["heads"]))
    return tensors


def whole_index(name, shape, tp, tensors, local_numel):
    """A function from an element of tensor rank tp's slice to its index in the whole."""
    whole = 1
    for d in shape:
        whole *= d
    split = split_of(name) if tensors > 1 else "replicated"
    if split == "replicated":
        return lambda i: i
    if split in ("rows", "kv_rows"):
        # A key/value head's rows held by several ranks: tp's slice is its head's.
        slice_of_tp = tp * (whole // local_numel) // tensors
        return lambda i: slice_of_tp * local_numel + i
    if split == "qkv_rows":
        block = local_numel // 3
        return lambda i: (i // block) * (whole // 3) + tp * block + i % block
    width = shape[1] // tensors  # columns
    return lambda i: (i // width) * shape[1] + tp * width + i % width


def add_matrix_state(out, key, values, path):
    """A MATRIX/KIND/NAME piece (state an optimizer keeps per whole matrix: GaLore's projected
    moments and projector), whole, under kind MATRIX/KIND; written once in a checkpoint."""
    _, state, name = key.split("/", 2)
    kinds = out.setdefault("MATRIX/" + state, {})
    if name in kinds:
        raise ValueError(f"{path}: {key} written twice")
    kinds[name] = values


def load(directory):
    """{kind: {tensor: array of fp32 bits}} and the manifest's model sizes."""
    with open(os.path.join(directory, "manifest.json")) as f:
        manifest = json.load(f)
    model, layout = manifest["model"], manifest["layout"]
    # Each kind the shards hold (an optimizer's state by its names: KINDS for AdamW).
    out = {k: {} for k in KINDS}
    written = {k: {} for k in KINDS}  # how often each element was written
    for entry in manifest["files"]:
        if "pp" not in entry:
            continue
        path = os.path.join(directory, entry["name"])
        if os.path.getsize(path) != entry["bytes"]:
            raise ValueError(f"{path}: {os.path.getsize(path)} bytes, manifest says {entry['bytes']}")
        for key, (dtype, shape, raw) in read_safetensors(path).items():
            if key.startswith("MATRIX/"):
                add_matrix_state(out, key, as_f32_bits(dtype, raw), path)
                continue
            kind, name = key.split("/", 1)
            lo = 0
            if kind != "param":
                name, lo = name.rsplit("/", 1)
                lo = int(lo)
            values = as_f32_bits(dtype, raw)
            whole_shape = full_shape(name, model, manifest.get("lora", {}).get("rank", 0))
            numel = 1
            for d in whole_shape:
                numel *= d
            local_numel = numel // slices(name, model, layout["tensor"])
            place = whole_index(name, whole_shape, entry["tp"], layout["tensor"], local_numel)
            target = out.setdefault(kind, {}).setdefault(name, array.array("I", bytes(4 * numel)))
            count = written.setdefault(kind, {}).setdefault(name, bytearray(numel))
            if lo + len(values) > local_numel:
                raise ValueError(f"{path}: {key} runs past its slice ({lo} + {len(values)} > {local_numel})")
            for i, v in enumerate(values):
                at = place(lo + i)
                target[at] = v
                count[at] += 1
    for kind in written:
        for name, count in written[kind].items():
            if any(c != 1 for c in count):
                bad = next(i for i, c in enumerate(count) if c != 1)
                raise ValueError(f"{directory}: {kind} {name} element {bad} written {count[bad]} times")
    return out, model


def to_float(bits):
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def compare(dir_a, dir_b, kinds=KINDS, rtol=None):
    """None where every element of every tensor of `kinds` matches (bitwise, or within rtol of
    the tensor's largest magnitude in b); else a sentence naming the first that does not.
    The vocabulary rows past the real ones (padding, which depends on the tensor-parallel
    size) must be zero; the rest of wte is compared."""
    a, model_a = load(dir_a)
    b, model_b = load(dir_b)
    vocab, hidden = model_a["vocab_size"], model_a["hidden"]
    if (vocab, hidden) != (model_b["vocab_size"], model_b["hidden"]):
        return f"different models: {model_a} and {model_b}"
    for kind in kinds:
        if sorted(a.get(kind, {})) != sorted(b.get(kind, {})):
            return f"{kind}: tensors {sorted(set(a[kind]) ^ set(b[kind]))} in one only"
        if not a[kind]:
            return f"{kind}: no tensors in {dir_a}"
        for name in sorted(a[kind]):
            x, y = a[kind][name], b[kind][name]
            if name in ("wte.weight", "embed_tokens.weight", "lm_head.weight"):
                for t, d in ((x, dir_a), (y, dir_b)):
                    if any(t[vocab * hidden:]):
                        return f"{kind} {name}: a padding row is not zero in {d}"
                x, y = x[:vocab * hidden], y[:vocab * hidden]
            if len(x) != len(y):
                return f"{kind} {name}: {len(x)} elements against {len(y)}"
            if rtol is None:
                if x != y:
                    i = next(i for i in range(len(x)) if x[i] != y[i])
                    return (f"{kind} {name} element {i}: {to_float(x[i])!r} ({x[i]:#010x}) "
                            f"against {to_float(y[i])!r} ({y[i]:#010x})")
                continue
            fx, fy = array.array("f", x.tobytes()), array.array("f", y.tobytes())
            scale = max(abs(v) for v in fy) or 1.0
            for i, (p, q) in enumerate(zip(fx, fy)):
                if not abs(p - q) <= rtol * scale:
                    return (f"{kind} {name} element {i}: {p!r} against {q!r} (difference "
                            f"{abs(p - q) / scale:.2e} of the tensor's largest, {scale:.3e})")
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--rtol", type=float, default=None)
    p.add_argument("--kinds", default=",".join(KINDS))
    args = p.parse_args()
    difference = compare(args.a, args.b, args.kinds.split(","), args.rtol)
    print(difference or "match")
    return 1 if difference else 0


if __name__ == "__main__":
    sys.exit(main())
