# The independent PyTorch reference for Trident's GPT-2, and the file formats and contracts the
# reference tests need to drive Trident from outside.
#
# Everything here is written from the contracts in docs/ARCHITECTURE.md, not from Trident's
# code, so a test that agrees with both proves the two implementations agree:
#   - GPT2Reference: GPT-2 (pre-LayerNorm, tied LM head, GELU tanh form) in float64, its
#     parameters named exactly as Hugging Face's GPT-2 with Conv1D layout ([in, out]).
#   - safetensors reading and writing with json + struct (no safetensors package needed).
#   - the llm.c token shard writer (256 int32 header, then uint16 tokens).
#   - the unshuffled sampling contract (which token windows make step s's global batch).
#   - the learning-rate schedule (warmup, then cosine | linear | constant decay).
#   - AdamW with Trident's decay groups, and a YAML config writer.
# Used by the test_*.py programs beside it, which ctest runs with Debian's /usr/bin/python3.

import json
import math
import struct

import numpy as np
import torch
import torch.nn as nn

# ---------------------------------------------------------------------------------------------
# safetensors: 8-byte little-endian header length, a JSON header
# {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the raw data;
# offsets count from the first byte after the header.

_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "U16": np.dtype("<u2"),
    "U32": np.dtype("<u4"),
    "U64": np.dtype("<u8"),
}


def _dtype_name(array):
    for name, dtype in _DTYPES.items():
        if array.dtype == dtype or array.dtype == dtype.newbyteorder("="):
            return name
    raise ValueError(f"safetensors: no dtype name for numpy dtype {array.dtype}")


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: numpy array} to `path`; tensors keep their dtype (F32, F64, I32, ...)."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        array = np.asarray(tensors[name])
        dtype_name = _dtype_name(array)
        blob = np.ascontiguousarray(array.astype(_DTYPES[dtype_name], copy=False)).tobytes()
        header[name] = {"dtype": dtype_name, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    # Pad the header with spaces so the data starts 8-byte aligned, as the Rust writer does.
    header_bytes += b" " * ((8 - len(header_bytes) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for blob in blobs:
            f.write(blob)


def read_safetensors(path):
    """Returns ({name: numpy array}, metadata dict). BF16 is widened to float32."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (header_len,) = struct.unpack("<Q", raw[:8])
    if 8 + header_len > len(raw):
        raise ValueError(f"{path}: header length {header_len} runs past the end of the file")
    header = json.loads(raw[8:8 + header_len].decode("utf-8"))
    data = memoryview(raw)[8 + header_len:]
    metadata = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if not 0 <= begin <= end <= len(data):
            raise ValueError(f"{path}: tensor {name} has offsets {begin}..{end} outside the data")
        chunk = bytes(data[begin:end])
        if info["dtype"] == "BF16":
            bits = np.frombuffer(chunk, dtype="<u2").astype(np.uint32) << 16
            array = bits.view(np.float32)
        elif info["dtype"] in _DTYPES:
            array = np.frombuffer(chunk, dtype=_DTYPES[info["dtype"]])
        else:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
        expected = int(np.prod(shape)) if shape else 1
        if array.size != expected:
            raise ValueError(f"{path}: tensor {name} holds {array.size} values, "
                             f"shape {list(shape)} needs {expected}")
        tensors[name] = array.reshape(shape).copy()
    return tensors, metadata


# ---------------------------------------------------------------------------------------------
# llm.c token shard: 256 little-endian int32 (magic 20240520, version 1, token count, zeros),
# then the tokens as little-endian uint16.

SHARD_MAGIC = 20240520
SHARD_VERSION = 1


def write_llmc_shard(path, tokens):
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() > 65535):
        raise ValueError("llm.c shards hold uint16 tokens")
    header = np.zeros(256, dtype="<i4")
    header[0], header[1], header[2] = SHARD_MAGIC, SHARD_VERSION, tokens.size
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u2").tobytes())


def read_llmc_shard(path):
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype="<i4")
        if header[0] != SHARD_MAGIC or header[1] != SHARD_VERSION:
            raise ValueError(f"{path}: not an llm.c v1 token shard")
        tokens = np.frombuffer(f.read(), dtype="<u2")
    if tokens.size != header[2]:
        raise ValueError(f"{path}: header says {header[2]} tokens, file holds {tokens.size}")
    return tokens.astype(np.int64)


# ---------------------------------------------------------------------------------------------
# The sampling contract with data.shuffle: false. Global sample k is the window starting at token
# (k mod W)·T with W = floor((N-1)/T); its targets are the same window shifted by one token.
# Step s uses samples s·B ... s·B+B-1.

def sample_window(tokens, k, seq_len):
    windows = (len(tokens) - 1) // seq_len
    if windows < 1:
        raise ValueError(f"{len(tokens)} tokens hold no window of {seq_len}+1")
    start = (k % windows) * seq_len
    return tokens[start:start + seq_len], tokens[start + 1:start + seq_len + 1]


def step_batch(tokens, step, global_batch, seq_len):
    """The (inputs, targets) of step `step` (0-based), each an int64 tensor (B, T)."""
    inputs, targets = [], []
    for k in range(step * global_batch, (step + 1) * global_batch):
        x, y = sample_window(tokens, k, seq_len)
        inputs.append(x)
        targets.append(y)
    return (torch.tensor(np.stack(inputs), dtype=torch.int64),
            torch.tensor(np.stack(targets), dtype=torch.int64))


# ---------------------------------------------------------------------------------------------
# Learning-rate schedule, for step index s counted from 0.

def lr_at(step, lr, min_lr, warmup, total_steps, decay):
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    if decay == "cosine":
        return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))
    if decay == "linear":
        return lr - (lr - min_lr) * progress
    if decay == "constant":
        return lr
    raise ValueError(f"unknown decay {decay!r}")


# ---------------------------------------------------------------------------------------------
# The model. Written with plain tensor arithmetic (no nn.LayerNorm, F.gelu or fused attention)
# so it shares no code path with anything it is compared against; float64 throughout.

class GPTShape:
    def __init__(self, vocab, seq_len, layers, hidden, heads, ffn):
        if hidden % heads:
            raise ValueError(f"hidden {hidden} is not a multiple of heads {heads}")
        self.vocab, self.seq_len, self.layers = vocab, seq_len, layers
        self.hidden, self.heads, self.ffn = hidden, heads, ffn


class LayerNorm(nn.Module):
    def __init__(self, width, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width, dtype=torch.float64))
        self.bias = nn.Parameter(torch.zeros(width, dtype=torch.float64))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(dim=-1, keepdim=True)
        centred = x - mean
        variance = (centred * centred).mean(dim=-1, keepdim=True)  # biased, as GPT-2
        return centred / torch.sqrt(variance + self.eps) * self.weight + self.bias


class Conv1D(nn.Module):
    """Hugging Face's Conv1D: y = x @ W + b with W stored [in, out]."""

    def __init__(self, fan_in, fan_out):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(fan_in, fan_out, dtype=torch.float64))
        self.bias = nn.Parameter(torch.zeros(fan_out, dtype=torch.float64))

    def forward(self, x):
        return x @ self.weight + self.bias


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


class Attention(nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.heads = shape.heads
        self.c_attn = Conv1D(shape.hidden, 3 * shape.hidden)
        self.c_proj = Conv1D(shape.hidden, shape.hidden)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.heads
        q, k, v = self.c_attn(x).split(C, dim=-1)                  # 3 x (B, T, C)
        q = q.reshape(B, T, self.heads, hs).transpose(1, 2)        # (B, NH, T, hs)
        k = k.reshape(B, T, self.heads, hs).transpose(1, 2)
        v = v.reshape(B, T, self.heads, hs).transpose(1, 2)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hs)         # (B, NH, T, T)
        future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)
        scores = scores.masked_fill(future, float("-inf"))
        scores = scores - scores.amax(dim=-1, keepdim=True)
        weights = torch.exp(scores)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        y = (weights @ v).transpose(1, 2).reshape(B, T, C)         # (B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.c_fc = Conv1D(shape.hidden, shape.ffn)
        self.c_proj = Conv1D(shape.ffn, shape.hidden)

    def forward(self, x):
        return self.c_proj(gelu_tanh(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.ln_1 = LayerNorm(shape.hidden)
        self.attn = Attention(shape)
        self.ln_2 = LayerNorm(shape.hidden)
        self.mlp = MLP(shape)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Reference(nn.Module):
    """GPT-2 whose named_parameters() are exactly Hugging Face's names (no "transformer.")."""

    def __init__(self, shape):
        super().__init__()
        self.shape = shape
        self.wte = nn.Embedding(shape.vocab, shape.hidden, dtype=torch.float64)
        self.wpe = nn.Embedding(shape.seq_len, shape.hidden, dtype=torch.float64)
        self.h = nn.ModuleList(Block(shape) for _ in range(shape.layers))
        self.ln_f = LayerNorm(shape.hidden)

    def logits(self, inputs):                                      # inputs (B, T) int64
        T = inputs.shape[1]
        x = self.wte.weight[inputs] + self.wpe.weight[torch.arange(T)]   # (B, T, C)
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        return x @ self.wte.weight.t()                             # (B, T, V), tied head

    def loss(self, inputs, targets):
        """Mean cross-entropy over every token, written out (log-sum-exp minus the target)."""
        logits = self.logits(inputs)
        top = logits.amax(dim=-1, keepdim=True)
        log_norm = torch.log(torch.exp(logits - top).sum(dim=-1)) + top.squeeze(-1)
        picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        return (log_norm - picked).mean()


def is_decayed(name):
    """Weight decay on matrices and embeddings only, as the optimizer contract says (docs/ARCHITECTURE.md)."""
    return name.endswith(".weight") and (name.startswith(("wte.", "wpe."))
                                         or ".attn." in name or ".mlp." in name)


def random_init(model, seed, std=0.02):
    """Non-trivial values everywhere, so every gradient path carries signal: matrices and
    embeddings N(0, std), linear biases N(0, std), LayerNorm weights 1 + 0.1·N(0, 1) and
    LayerNorm biases 0.1·N(0, 1)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float64)
            if is_decayed(name):
                p.copy_(std * noise)
            elif ".ln_" in name or name.startswith("ln_f."):
                p.copy_(1.0 + 0.1 * noise if name.endswith(".weight") else 0.1 * noise)
            else:
                p.copy_(std * noise)


def round_to_float32(model):
    """Rounds every parameter to float32 values, so the float64 reference starts from exactly
    the weights a float32 safetensors file hands to Trident."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.float32).to(torch.float64))


def state_as_numpy(model, prefix="", dtype=np.float32):
    return {prefix + name: p.detach().numpy().astype(dtype)
            for name, p in model.named_parameters()}


def save_hf_weights(model, path, with_prefix):
    """Writes the model as a Hugging Face GPT-2 safetensors file of F32 tensors."""
    write_safetensors(path, state_as_numpy(model, "transformer." if with_prefix else ""),
                      metadata={"format": "pt"})


def make_adamw(model, lr, beta1, beta2, eps, weight_decay):
    decayed = [p for n, p in model.named_parameters() if is_decayed(n)]
    plain = [p for n, p in model.named_parameters() if not is_decayed(n)]
    return torch.optim.AdamW([{"params": decayed, "weight_decay": weight_decay},
                              {"params": plain, "weight_decay": 0.0}],
                             lr=lr, betas=(beta1, beta2), eps=eps)


# ---------------------------------------------------------------------------------------------
# Configs and comparisons.

def _yaml_value(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        # repr round-trips the double; a mantissa without a dot ("1e-08") would be a string
        # to YAML 1.1 readers, so give it one.
        text = repr(value)
        mantissa, e, exponent = text.partition("e")
        return (mantissa if "." in mantissa else mantissa + ".0") + e + exponent
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid YAML scalar
    return str(value)


def write_config(path, sections):
    """Writes {section: {key: value}} (or {key: scalar}) as block YAML."""
    lines = []
    for section, body in sections.items():
        if isinstance(body, dict):
            lines.append(f"{section}:")
            lines.extend(f"  {key}: {_yaml_value(value)}" for key, value in body.items())
        else:
            lines.append(f"{section}: {_yaml_value(body)}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def relative_error(actual, expected):
    """max|a - b| / max|b| over a tensor (absolute error when b is all zero)."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if actual.shape != expected.shape:
        return float("inf")
    if actual.size == 0:
        return 0.0
    scale = float(np.max(np.abs(expected)))
    diff = float(np.max(np.abs(actual - expected)))
    return diff / scale if scale > 0 else diff
