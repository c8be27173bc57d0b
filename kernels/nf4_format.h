// The parts of QLoRA's 4-bit NormalFloat format (kernels/nf4.h) that every backend's
// dequantizer shares: where a shard's blocks lie in the whole matrix, a block's absmax under
// double quantization, and the device view of one quantized matrix the op set reads
// (Ops::nf4_dequantize). docs/ARCHITECTURE.md, "Low-rank adapters".
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/host_device.h"

namespace trident::kernels {

// The absmax values per second-level block under double quantization.
inline constexpr std::size_t kNf4AbsmaxBlock = 256;

// Where a shard's blocks lie in the whole matrix's: its block b is the whole matrix's block
// (b / period)·stride + first + b % period. A tensor split's slice is runs of one length, one
// stride apart (model/param_layout.h, for_each_slice_run), so this covers every split; the
// default is the whole matrix.
struct Nf4BlockMap {
    std::size_t period = SIZE_MAX, stride = 0, first = 0;

    TRIDENT_HOST_DEVICE std::size_t whole(std::size_t b) const {
        return b / period * stride + first + b % period;
    }
};

// a' = c + q·s/127 in fp32: the absmax a block's int8 code q stands for, with its second-level
// block's scale s and the matrix's mean c (kernels/nf4.h).
TRIDENT_HOST_DEVICE inline float nf4_absmax(int8_t q, float scale, float mean) {
    const float step = static_cast<float>(q) * scale;
    return mean + step / 127.0f;
}

// One quantized matrix, or one rank's shard of one, in device memory: `count` elements in
// blocks of `block`, each block's codes and absmax (fp32, or with double quantization its
// int8 code, the whole matrix's second-level scales and its mean).
struct Nf4Matrix {
    const uint8_t* codes = nullptr;       // (count / 2): two a byte, the first in the low nibble
    const float* absmax = nullptr;        // (count / block), without double quantization
    const int8_t* absmax_q = nullptr;     // (count / block), with it
    const float* absmax_scale = nullptr;  // (whole blocks / 256, rounded up), with it
    const float* absmax_mean = nullptr;   // (1), with it
    std::size_t count = 0, block = 64;
    Nf4BlockMap map;  // the shard's blocks in the whole matrix (for absmax_scale)
};

}  // namespace trident::kernels
