"""QLoRA's NF4 quantization in numpy, as docs/ARCHITECTURE.md ("Low-rank adapters") and
kernels/nf4.h define it: blocks of `block` values of the matrix flattened row by row (output x
input), each value the index of the nearest code-book value to w / absmax (the lower index on
a tie, distances in float64; absmax 0 codes 0.0), two codes a byte, the first in the low nibble.
Double quantization: c = the float64 sum of the absmax values in order over their count, rounded
once to float32; per 256 absmax values s = max |a - c|; q = round((a - c) / s * 127) in float32,
half away from zero (s = 0: q = 0); a' = c + q * s / 127 in float32. Dequantized: code * a'.
"""
import numpy as np

# QLoRA appendix E, bitsandbytes' table.
CODES = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                  -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                  0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
                  0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                  0.7229568362236023, 1.0], dtype=np.float32)
ABSMAX_BLOCK = 256
F32 = np.float32


def block_absmax(w, block):
    pad = (-w.size) % block
    padded = np.concatenate([np.abs(w), np.zeros(pad, F32)])
    return padded.reshape(-1, block).max(axis=1)


def codes_of(w, absmax, block):
    a = np.repeat(absmax, block)[:w.size]
    safe = np.where(a == 0, F32(1), a)
    x = (w / safe).astype(F32)
    distances = np.abs(x.astype(np.float64)[:, None] - CODES.astype(np.float64)[None, :])
    codes = np.argmin(distances, axis=1).astype(np.uint8)  # the first minimum: lower index
    return np.where(a == 0, np.uint8(7), codes)


def round_half_away(x):
    whole = np.trunc(x)
    return np.where(np.abs(x - whole) >= F32(0.5), whole + np.sign(x), whole).astype(F32)


def double_quantize(absmax):
    """(c, s per 256, q per block, a' per block)."""
    c = F32(np.cumsum(absmax.astype(np.float64))[-1] / absmax.size)
    pad = (-absmax.size) % ABSMAX_BLOCK
    deviation = np.abs(absmax - c).astype(F32)
    s = np.concatenate([deviation, np.zeros(pad, F32)]).reshape(-1, ABSMAX_BLOCK).max(axis=1)
    s_each = np.repeat(s, ABSMAX_BLOCK)[:absmax.size]
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = ((absmax - c) / s_each).astype(F32) * F32(127)
    q = np.where(s_each == 0, F32(0), round_half_away(scaled.astype(F32))).astype(np.int8)
    step = ((q.astype(F32) * s_each).astype(F32) / F32(127)).astype(F32)
    return c, s, q, (c + step).astype(F32)


def quantize(w, block=64, double_quant=True):
    """w: float32 (out, in). Returns (packed codes uint8, a' per block float32)."""
    flat = np.ascontiguousarray(w, dtype=F32).reshape(-1)
    absmax = block_absmax(flat, block)
    codes = codes_of(flat, absmax, block)
    padded = np.concatenate([codes, np.zeros(codes.size % 2, np.uint8)])
    packed = (padded[0::2] | (padded[1::2] << 4)).astype(np.uint8)
    scales = double_quantize(absmax)[3] if double_quant else absmax
    return packed, scales


def dequantize(packed, scales, size, block=64):
    codes = np.stack([packed & 0xF, packed >> 4], axis=1).reshape(-1)[:size]
    return (CODES[codes] * np.repeat(scales, block)[:size]).astype(F32)


def dequantized(w, block=64, double_quant=True):
    """The matrix as the 4-bit base holds it, float32, w's shape."""
    packed, scales = quantize(w, block, double_quant)
    return dequantize(packed, scales, w.size, block).reshape(w.shape)
