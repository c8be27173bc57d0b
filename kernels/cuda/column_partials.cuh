// Deterministic column sums over the rows of a matrix, for the gradients of parameters that
// every row shares (LayerNorm's weight and bias, a linear layer's bias).
//
// Atomics would add the rows in whatever order the blocks run, so the sum would change from
// run to run. Instead the rows are cut into a fixed number of chunks (a function of N alone):
// pass 1 gives each (chunk, column) to one thread, which sums the chunk's rows in order;
// pass 2 sums the chunks of each column in order and adds the total into the gradient.
#pragma once

#include <algorithm>
#include <cstddef>

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

// Pass 2: gradient[q][c] += sum over chunks of partial[chunk][q][c], q < Q, in chunk order.
// `partial` is (chunks, Q, channels); gradient[q] may be null (not wanted). Gradients have their
// own element type (fp32 under fp32 gradient accumulation); the launcher checks it is a float type
// (require_float_elements).
template <int Q>
struct ColumnGradients {
    Ptr gradient[Q];
};

template <int Q>
__global__ void add_column_partials_kernel(ColumnGradients<Q> out, const float* partial, int chunks,
                                           int channels) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= channels) return;
#pragma unroll
    for (int q = 0; q < Q; ++q) {
        const Ptr g = out.gradient[q];
        if (g.data == nullptr) continue;
        float sum = 0.0f;
        for (int chunk = 0; chunk < chunks; ++chunk)
            sum += partial[(static_cast<std::size_t>(chunk) * Q + q) * channels + c];
        store_from_float(g.data, g.dtype, c, load_as_float(g.data, g.dtype, c) + sum);
    }
}

}  // namespace trident::kernels::cuda
