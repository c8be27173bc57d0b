#!/usr/bin/python3
"""The NF4 quantizer of a 4-bit LoRA base (training.lora.quantize: nf4; kernels/nf4.h).

1. The numpy reference (nf4_reference.py) against QLoRA's numbers: its code book is the
   appendix's sixteen values, ascending, with an exact 0 and +-1; its blocks run along the
   rows (one block's absmax per 64 values of the flattened (out, in) matrix); an exact tie
   codes the lower index; absmax 0 codes 0.0; the packing puts the first code in the low
   nibble; without double quantization |w - dequantized| <= half the widest code-book gap
   times the block's absmax, with it that bound plus |a - a'| (a' within s/254 of a).
2. Trident's quantizer (trident_nf4_dump) gives the reference's codes, a' and dequantized
   weights bit for bit (fp32, element by element) on matrices with ties, zero blocks, heavy
   tails and a last 256-block cut short, with and without double quantization, blocks of
   16, 64 and 256.

Exit status: 0 passed, 1 a check failed, 77 skipped (no numpy or torch).
"""
import argparse
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError as e:
    print(f"SKIP: needs numpy ({e})")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nf4_reference as nf4  # noqa: E402

FAILURES = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        FAILURES.append(what)


def check_reference():
    codes = nf4.CODES
    check(codes.size == 16 and codes[0] == -1 and codes[7] == 0 and codes[15] == 1
          and np.all(np.diff(codes) > 0), "code book: 16 ascending values, -1, 0 and 1")
    check(codes[8] == np.float32(0.07958029955625534)
          and codes[1] == np.float32(-0.6961928009986877), "code book: appendix E's values")
    w = np.zeros((2, 64), np.float32)
    w[0, 3], w[1, 0] = 2.0, -4.0
    absmax = nf4.block_absmax(w.reshape(-1), 64)
    check(list(absmax) == [2.0, 4.0], "blocks of 64 along the rows: absmax per row here")
    # Halfway between codes 9 and 10, exactly, in float32 (not every pair's midpoint is).
    mid = np.float32((np.float64(codes[9]) + np.float64(codes[10])) / 2)
    tie = np.array([1.0, mid] + [0.0] * 14, np.float32)
    check(np.float64(mid) - codes[9] == codes[10] - np.float64(mid), "the tie is exact")
    packed, _ = nf4.quantize(tie.reshape(1, -1), 16, False)
    check(packed[0] == (15 | (9 << 4)), "a tie codes the lower index; low nibble first")
    packed, scales = nf4.quantize(np.zeros((1, 16), np.float32), 16, False)
    check(np.all(packed == 7 | (7 << 4)) and scales[0] == 0, "absmax 0 codes 0.0")
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((48, 128)) * 0.02).astype(np.float32)
    gap = np.max(np.diff(codes.astype(np.float64))) / 2
    a = np.repeat(nf4.block_absmax(w.reshape(-1), 64), 64).reshape(w.shape)
    error = np.abs(nf4.dequantized(w, 64, False).astype(np.float64) - w)
    check(np.all(error <= gap * a * (1 + 1e-6)), f"error <= widest gap/2 * absmax "
          f"(worst {np.max(error / a / gap):.4f} of the bound)")
    c, s, q, a2 = nf4.double_quantize(nf4.block_absmax(w.reshape(-1), 64))
    a1 = nf4.block_absmax(w.reshape(-1), 64)
    check(np.all(np.abs(a2 - a1) <= np.repeat(s, 256)[:a1.size] / 254 * (1 + 1e-5)),
          "double quantization: |a - a'| <= s/254")
    error = np.abs(nf4.dequantized(w, 64, True).astype(np.float64) - w)
    bound = gap * np.repeat(a2, 64).reshape(w.shape) + np.abs(a - np.repeat(a2, 64).reshape(w.shape))
    check(np.all(error <= bound * (1 + 1e-6)), "double quantization: error within its bound")


def matrices():
    rng = np.random.default_rng(7)
    normal = (rng.standard_normal((96, 704)) * 0.05).astype(np.float32)  # 1056 blocks of 64
    heavy = (rng.standard_t(2, (64, 256)) * 0.1).astype(np.float32)
    zeros = normal.copy()[:32]
    zeros[3, :] = 0.0  # zero blocks
    zeros[5, :128] = 1e-30
    ties = np.tile(np.concatenate([[1.0], (nf4.CODES[:-1] + nf4.CODES[1:]) / 2,
                                   np.zeros(48)]).astype(np.float32), (8, 1))
    return {"normal": normal, "heavy": heavy, "zeros": zeros, "ties": ties}


def check_trident(dump):
    with tempfile.TemporaryDirectory() as tmp:
        for name, w in matrices().items():
            for block in (16, 64, 256):
                for dq in (False, True):
                    path = os.path.join(tmp, name)
                    w.tofile(path)
                    subprocess.run([dump, path, str(block), "1" if dq else "0", path], check=True)
                    packed, scales = nf4.quantize(w, block, dq)
                    got_codes = np.fromfile(path + ".codes", np.uint8)
                    got_scales = np.fromfile(path + ".absmax", np.float32)
                    got = np.fromfile(path + ".weights", np.float32)
                    want = nf4.dequantize(packed, scales, w.size, block)
                    same = (np.array_equal(got_codes, packed)
                            and np.array_equal(got_scales.view(np.uint32), scales.view(np.uint32))
                            and np.array_equal(got.view(np.uint32), want.view(np.uint32)))
                    check(same, f"{name} {w.shape} block {block} double_quant {dq}: codes, a' "
                          f"and {w.size} dequantized weights bit for bit")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trident", required=True)
    p.add_argument("--tools-dir", required=True)
    a = p.parse_args()
    check_reference()
    check_trident(os.path.join(a.tools_dir, "trident_nf4_dump"))
    print(f"{len(FAILURES)} failed" if FAILURES else "all passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
