// Deterministic column sums over the rows of a matrix, for the gradients of parameters that
// every row shares (LayerNorm's weight and bias, RMSNorm's weight, a linear layer's bias).
//
// Atomics would add the rows in whatever order the blocks run, so the sum would change from
// run to run. Instead the rows are cut into a fixed number of chunks (a function of N alone):
// pass 1, the caller's kernel, writes each chunk's column sums, partial (chunks, Q, channels); pass
// 2 (here) sums the chunks of each column in a fixed order and adds the total into the gradient.
#pragma once

#include <algorithm>
#include <cstddef>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elements.cuh"

namespace trident::kernels::cuda {

constexpr int kColumnThreads = 256;

// Chunks of rows for N rows: enough blocks to fill a GPU for N in the thousands, each chunk at
// least 32 rows so a thread does real work.
inline int row_chunks(int N) {
    return std::max(1, std::min(128, (N + 31) / 32));
}
inline int rows_per_chunk(int N) {
    return (N + row_chunks(N) - 1) / row_chunks(N);
}

// The gradients pass 2 adds into: gradient[q] (channels) for q < Q, each of its own element type
// (fp32 under fp32 gradient accumulation; the launcher checks it is a float type with
// require_float_elements), or null (not wanted).
template <int Q>
struct ColumnGradients {
    Ptr gradient[Q];
};

// Pass 2 in blocks of 32 columns by 8 groups of chunks: group y sums chunks y, y + 8, ... of
// its column in order (each warp reads 32 adjacent floats of a chunk), then the first group
// adds the 8 group sums in order. gradient[q][c] += that total.
inline constexpr int kPartialColumns = 32, kPartialGroups = 8;

template <int Q>
__global__ void __launch_bounds__(kPartialColumns* kPartialGroups)
    add_column_partials_kernel(ColumnGradients<Q> out, const float* partial, int chunks,
                               int channels) {
    __shared__ float group_sums[kPartialGroups][kPartialColumns];
    const int column = threadIdx.x % kPartialColumns, group = threadIdx.x / kPartialColumns;
    const int c = blockIdx.x * kPartialColumns + column;
#pragma unroll
    for (int q = 0; q < Q; ++q) {
        const Ptr g = out.gradient[q];
        if (g.data == nullptr) continue;  // the same in every thread
        float sum = 0.0f;
        if (c < channels)
            for (int chunk = group; chunk < chunks; chunk += kPartialGroups)
                sum += partial[(static_cast<std::size_t>(chunk) * Q + q) * channels + c];
        group_sums[group][column] = sum;
        __syncthreads();
        if (group == 0 && c < channels) {
            float total = 0.0f;
#pragma unroll
            for (int y = 0; y < kPartialGroups; ++y) total += group_sums[y][column];
            store_from_float(g.data, g.dtype, c, load_as_float(g.data, g.dtype, c) + total);
        }
        __syncthreads();  // group_sums is written again for the next q
    }
}

template <int Q>
void add_column_partials(ColumnGradients<Q> out, const float* partial, int chunks, int channels,
                         cudaStream_t stream) {
    if (channels == 0) return;
    const unsigned blocks =
        static_cast<unsigned>((channels + kPartialColumns - 1) / kPartialColumns);
    add_column_partials_kernel<Q>
        <<<blocks, kPartialColumns * kPartialGroups, 0, stream>>>(out, partial, chunks, channels);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

}  // namespace trident::kernels::cuda
