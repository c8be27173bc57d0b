// Root-mean-square normalisation over the channels of each row (Llama's RMSNorm, with its
// statistics in fp32 as Hugging Face's LlamaRMSNorm computes them), forward and backward.
//
// One warp per row, as layernorm.cu: the row is read once for the mean square and once to
// write; the second read hits the caches. The weight gradient is a column sum over the rows,
// done in a fixed order (column_partials.cuh), so it repeats bit for bit.
#include "kernels/cuda/column_partials.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/elements.cuh"

namespace trident::kernels::cuda {

namespace {

constexpr int kRowThreads = 256;  // 8 warps: 8 rows per block
constexpr int kRowsPerBlock = kRowThreads / 32;

// out (N,channels) = inp * rstd * weight, rstd (N) = 1 / sqrt(mean_c(inp^2) + eps).
template <typename E>
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_forward_kernel(E* out, float* rstd, const E* inp, const E* weight, int N, int channels,
                           float eps) {
    const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= N) return;
    const std::size_t offset = static_cast<std::size_t>(row) * channels;
    const E* x = inp + offset;
    float sum_sq = 0.0f;
    for (int c = lane; c < channels; c += 32) {
        const float v = to_float(x[c]);
        sum_sq += v * v;
    }
    const float s = 1.0f / sqrtf(warp_sum(sum_sq) / channels + eps);
    E* y = out + offset;
    for (int c = lane; c < channels; c += 32)
        y[c] = from_float<E>(to_float(x[c]) * s * to_float(weight[c]));
    if (lane == 0) rstd[row] = s;
}

// With dnorm = dout * weight, per row:
//   dinp += rstd * dnorm - inp * rstd^3 * mean_c(dnorm * inp)
template <typename E>
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_backward_input_kernel(E* dinp, const E* dout, const E* inp, const E* weight,
                                  const float* rstd, int N, int channels) {
    const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= N) return;
    const std::size_t offset = static_cast<std::size_t>(row) * channels;
    const E* x = inp + offset;
    const E* dy = dout + offset;
    const float s = rstd[row];
    float dot = 0.0f;
    for (int c = lane; c < channels; c += 32)
        dot += to_float(dy[c]) * to_float(weight[c]) * to_float(x[c]);
    const float k = s * s * s * warp_sum(dot) / channels;
    E* dx = dinp + offset;
    for (int c = lane; c < channels; c += 32) {
        // In the CPU backend's order: (s * dout) * weight.
        const float g = s * to_float(dy[c]) * to_float(weight[c]);
        dx[c] = from_float<E>(to_float(dx[c]) + (g - to_float(x[c]) * k));
    }
}

// Pass 1 of the weight gradient: partial (chunks, channels) = per chunk of rows, the column sums of
// dout * inp * rstd.
template <typename E>
__global__ void __launch_bounds__(kColumnThreads)
    rmsnorm_weight_partials_kernel(float* partial, const E* dout, const E* inp, const float* rstd,
                                   int N, int channels, int chunk_rows) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int chunk = blockIdx.y;
    if (c >= channels) return;
    const int end = min(N, (chunk + 1) * chunk_rows);
    float dw = 0.0f;
    for (int n = chunk * chunk_rows; n < end; ++n) {
        const std::size_t i = static_cast<std::size_t>(n) * channels + c;
        dw += to_float(dout[i]) * to_float(inp[i]) * rstd[n];
    }
    partial[static_cast<std::size_t>(chunk) * channels + c] = dw;
}

unsigned row_blocks(int N) {
    return static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock);
}

}  // namespace

template <typename E>
void rmsnorm_forward(E* out, float* rstd, const E* inp, const E* weight, int N, int channels,
                     float eps, cudaStream_t stream) {
    if (N == 0) return;
    rmsnorm_forward_kernel<<<row_blocks(N), kRowThreads, 0, stream>>>(out, rstd, inp, weight, N,
                                                                      channels, eps);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

std::size_t rmsnorm_backward_scratch(int N, int channels) {
    return static_cast<std::size_t>(row_chunks(N)) * channels;
}

template <typename E>
void rmsnorm_backward(E* dinp, Ptr dweight, float* scratch, const E* dout, const E* inp,
                      const E* weight, const float* rstd, int N, int channels,
                      cudaStream_t stream) {
    if (N == 0) return;
    if (dinp) {
        rmsnorm_backward_input_kernel<<<row_blocks(N), kRowThreads, 0, stream>>>(
            dinp, dout, inp, weight, rstd, N, channels);
        TRIDENT_CUDA_CHECK_LAUNCH();
    }
    if (!dweight) return;
    require_float_elements(dweight.dtype, "an RMSNorm weight gradient");
    const unsigned column_blocks =
        static_cast<unsigned>((channels + kColumnThreads - 1) / kColumnThreads);
    const dim3 grid(column_blocks, static_cast<unsigned>(row_chunks(N)));
    rmsnorm_weight_partials_kernel<<<grid, kColumnThreads, 0, stream>>>(
        scratch, dout, inp, rstd, N, channels, rows_per_chunk(N));
    TRIDENT_CUDA_CHECK_LAUNCH();
    add_column_partials<1>({{dweight}}, scratch, row_chunks(N), channels, stream);
}

#define TRIDENT_INSTANTIATE(E)                                                                     \
    template void rmsnorm_forward<E>(E*, float*, const E*, const E*, int, int, float,              \
                                     cudaStream_t);                                                \
    template void rmsnorm_backward<E>(E*, Ptr, float*, const E*, const E*, const E*, const float*, \
                                      int, int, cudaStream_t);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(__nv_bfloat16)
TRIDENT_INSTANTIATE(__half)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::kernels::cuda
