// What the flash kernels (attention_flash.cu) and ring attention's block kernels
// (attention_block.cu) share: rows of q, k, v read into registers and tiles of rows into
// shared memory, as float from an element type known at run time.
//
// Split = ceil(hs / 32) threads share a row, thread s holding dims s, s + Split, s + 2 Split,
// ... (kDimsPerThread = 32 each, so heads of up to 128 take Split 4), so a row's dot product is
// 32 fused multiply-adds and log2(Split) shuffles, and the Split threads of a row read
// adjacent shared-memory words (no bank conflicts). Register arrays are indexed by unrolled
// loops only (compile-time indices), so they stay in registers.
#pragma once

#include <cstddef>

#include "kernels/cuda/elements.cuh"
#include "kernels/dtype.h"

namespace trident::kernels::cuda {

inline constexpr int kTile = 32;  // rows per shared-memory tile
inline constexpr int kDimsPerThread = 32;

// Threads per row for heads of hs elements (at most kFlashMaxHeadSize, attention.h).
inline int split_of(int hs) {
    return hs <= 32 ? 1 : hs <= 64 ? 2 : 4;
}

// The sum over the Split threads of a row (a butterfly in a fixed order).
template <int Split>
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
    for (int offset = Split / 2; offset > 0; offset /= 2)
        x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

// A matrix of `rows` rows of `hs` elements, row r at element base + r * stride of src, of
// element type `type`.
struct Rows {
    const void* src;
    DType type;
    std::size_t base, stride;
    int rows, hs;

    __device__ float at(int row, int d) const {
        return row < rows && d < hs ? load_as_float(src, type, base + row * stride + d) : 0.0f;
    }
};

// tile (kTile, D) = rows row0 .. row0 + kTile - 1 of m as float; rows past its end and dims
// past hs are zero.
template <int D>
__device__ void load_tile(float* tile, const Rows& m, int row0) {
    for (int idx = threadIdx.x; idx < kTile * D; idx += blockDim.x)
        tile[idx] = m.at(row0 + idx / D, idx % D);
}

// A thread's dims of one row of m: dim k * Split + s into x[k].
template <int Split>
__device__ void load_row(float (&x)[kDimsPerThread], const Rows& m, int row, int s) {
#pragma unroll
    for (int k = 0; k < kDimsPerThread; ++k) x[k] = m.at(row, k * Split + s);
}

}  // namespace trident::kernels::cuda
