// QLoRA's 4-bit NormalFloat (NF4) format of a frozen weight matrix (Dettmers et al. 2023,
// "QLoRA", section 3 and appendix E; docs/ARCHITECTURE.md, "Low-rank adapters"): the matrix,
// (out, in) flattened row by row, is cut into blocks of `block` elements; each element is the
// index of the code-book value nearest to w / absmax(block), two codes a byte, the first in
// the low nibble. With double quantization the blocks' absmax values are themselves stored in
// 8 bits: minus their mean c over the whole matrix (summed in float64, rounded once to fp32),
// in blocks of 256 with one fp32 scale s = max |a − c| each, q = round((a − c) / s · 127)
// (fp32, half away from zero) and a' = c + q·s/127. This second level is a linear int8 code,
// simpler than bitsandbytes' dynamic 8-bit map. A dequantized weight is code · a' in fp32.
//
// Host code: the quantizer runs once when the base is loaded; the dequantizer is the
// reference every backend's (and tests/python/nf4_reference.py's) is held to bit for bit.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/nf4_format.h"

namespace trident::kernels {

// QLoRA's appendix E (bitsandbytes' table), ascending: the quantiles of N(0, 1) scaled to
// [−1, 1], with an exact zero.
inline constexpr std::array<float, 16> kNf4Codes = {-1.0f,
                                                    -0.6961928009986877f,
                                                    -0.5250730514526367f,
                                                    -0.39491748809814453f,
                                                    -0.28444138169288635f,
                                                    -0.18477343022823334f,
                                                    -0.09105003625154495f,
                                                    0.0f,
                                                    0.07958029955625534f,
                                                    0.16093020141124725f,
                                                    0.24611230194568634f,
                                                    0.33791524171829224f,
                                                    0.44070982933044434f,
                                                    0.5626170039176941f,
                                                    0.7229568362236023f,
                                                    1.0f};

// One quantized matrix, or one rank's shard of one (nf4_shard).
struct Nf4Tensor {
    std::size_t size = 0;             // elements
    std::size_t block = 64;           // elements per absmax
    std::vector<uint8_t> codes;       // (size + 1) / 2
    std::vector<float> absmax;        // one per block, without double quantization
    std::vector<int8_t> absmax_q;     // one per block, with it
    std::vector<float> absmax_scale;  // one per kNf4AbsmaxBlock of the whole matrix's, with it
    float absmax_mean = 0;            // c, with it
    Nf4BlockMap map;                  // a shard's blocks in the whole matrix

    bool double_quant() const { return !absmax_q.empty(); }
    std::size_t blocks() const { return (size + block - 1) / block; }
    // a' of block b of this tensor (its own numbering).
    float block_absmax(std::size_t b) const;
    // The bytes the format holds: codes, absmax (or their codes, scales and mean); a shard's
    // map is bookkeeping, not counted.
    std::size_t bytes() const;
};

// Quantizes a whole matrix (out·in values, row by row).
Nf4Tensor nf4_quantize(std::span<const float> weights, std::size_t block, bool double_quant);

// The `blocks` blocks of a whole matrix's quantization that a shard holds, where `map` puts
// them, in the shard's order: their codes and absmax, and the whole matrix's second-level
// scales and mean.
Nf4Tensor nf4_shard(const Nf4Tensor& whole, const Nf4BlockMap& map, std::size_t blocks);

// out (size) = code · a', fp32: the reference every backend's Ops::nf4_dequantize equals.
void nf4_dequantize(const Nf4Tensor& t, std::span<float> out);

}  // namespace trident::kernels
