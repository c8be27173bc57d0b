// Layer normalisation over the channels of each row (eps 1e-5, biased variance, as torch),
// forward (optionally with the residual add before it fused in) and backward.
//
// One warp per row: the row is read once for the mean, once for the variance (as the mean of
// (x - mean)^2, which does not cancel when |mean| >> std) and once to write; the second and
// third reads hit the L1/L2 caches. The parameter gradients are column sums over the rows,
// done in a fixed order (column_partials.cuh).
#include "kernels/cuda/column_partials.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/elements.cuh"

namespace trident::kernels::cuda {

namespace {

constexpr float kEps = 1e-5f;
constexpr int kRowThreads = 256;  // 8 warps: 8 rows per block
constexpr int kRowsPerBlock = kRowThreads / 32;

// mean and rstd of one row, by the 32 lanes of a warp.
template <typename E>
__device__ void row_statistics(const E* x, int channels, int lane, float& mean, float& rstd) {
    float sum = 0.0f;
    for (int c = lane; c < channels; c += 32) sum += to_float(x[c]);
    mean = warp_sum(sum) / channels;
    float sum_sq = 0.0f;
    for (int c = lane; c < channels; c += 32) {
        const float d = to_float(x[c]) - mean;
        sum_sq += d * d;
    }
    rstd = 1.0f / sqrtf(warp_sum(sum_sq) / channels + kEps);
}

// out (N,channels) = (x - mean) * rstd * weight + bias with x = inp, or with x = residual = a + b
// (written, rounded) when `a` is given.
template <typename E>
__global__ void layernorm_forward_kernel(E* out, float* mean, float* rstd, E* residual, const E* a,
                                         const E* b, const E* weight, const E* bias, int N,
                                         int channels) {
    const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= N) return;
    const std::size_t offset = static_cast<std::size_t>(row) * channels;
    const E* x = b + offset;
    if (a != nullptr) {
        // Each lane rereads only what it wrote itself, so no barrier is needed.
        for (int c = lane; c < channels; c += 32)
            residual[offset + c] = from_float<E>(to_float(a[offset + c]) + to_float(b[offset + c]));
        x = residual + offset;
    }
    float m, s;
    row_statistics(x, channels, lane, m, s);
    E* y = out + offset;
    for (int c = lane; c < channels; c += 32)
        y[c] = from_float<E>((to_float(x[c]) - m) * s * to_float(weight[c]) + to_float(bias[c]));
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

// With norm = (x - mean) * rstd and dnorm = dout * weight, per row:
//   dinp += rstd * (dnorm - mean_c(dnorm) - norm * mean_c(dnorm * norm))
template <typename E>
__global__ void layernorm_backward_input_kernel(E* dinp, const E* dout, const E* inp,
                                                const E* weight, const float* mean,
                                                const float* rstd, int N, int channels) {
    const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= N) return;
    const std::size_t offset = static_cast<std::size_t>(row) * channels;
    const E* x = inp + offset;
    const E* dy = dout + offset;
    const float m = mean[row], s = rstd[row];
    float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
    for (int c = lane; c < channels; c += 32) {
        const float dnorm = to_float(dy[c]) * to_float(weight[c]);
        dnorm_sum += dnorm;
        dnorm_norm_sum += dnorm * (to_float(x[c]) - m) * s;
    }
    const float dnorm_mean = warp_sum(dnorm_sum) / channels;
    const float dnorm_norm_mean = warp_sum(dnorm_norm_sum) / channels;
    E* dx = dinp + offset;
    for (int c = lane; c < channels; c += 32) {
        const float norm = (to_float(x[c]) - m) * s;
        const float dnorm = to_float(dy[c]) * to_float(weight[c]);
        dx[c] = from_float<E>(to_float(dx[c]) + s * (dnorm - dnorm_mean - norm * dnorm_norm_mean));
    }
}

// Pass 1 of the parameter gradients: partial (chunks, 2, channels) = per chunk of rows, the column
// sums of dout * norm (dweight) and of dout (dbias).
template <typename E>
__global__ void layernorm_param_partials_kernel(float* partial, const E* dout, const E* inp,
                                                const float* mean, const float* rstd, int N,
                                                int channels, int chunk_rows) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int chunk = blockIdx.y;
    if (c >= channels) return;
    const int end = min(N, (chunk + 1) * chunk_rows);
    float dw = 0.0f, db = 0.0f;
    for (int n = chunk * chunk_rows; n < end; ++n) {
        const std::size_t i = static_cast<std::size_t>(n) * channels + c;
        const float dy = to_float(dout[i]);
        dw += dy * (to_float(inp[i]) - mean[n]) * rstd[n];
        db += dy;
    }
    partial[(static_cast<std::size_t>(chunk) * 2 + 0) * channels + c] = dw;
    partial[(static_cast<std::size_t>(chunk) * 2 + 1) * channels + c] = db;
}

unsigned row_blocks(int N) {
    return static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock);
}

}  // namespace

template <typename E>
void layernorm_forward(E* out, float* mean, float* rstd, const E* inp, const E* weight,
                       const E* bias, int N, int channels, cudaStream_t stream) {
    if (N == 0) return;
    layernorm_forward_kernel<<<row_blocks(N), kRowThreads, 0, stream>>>(
        out, mean, rstd, static_cast<E*>(nullptr), static_cast<const E*>(nullptr), inp, weight,
        bias, N, channels);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

template <typename E>
void residual_layernorm_forward(E* residual, E* out, float* mean, float* rstd, const E* a,
                                const E* b, const E* weight, const E* bias, int N, int channels,
                                cudaStream_t stream) {
    if (N == 0) return;
    layernorm_forward_kernel<<<row_blocks(N), kRowThreads, 0, stream>>>(
        out, mean, rstd, residual, a, b, weight, bias, N, channels);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

std::size_t layernorm_backward_scratch(int N, int channels) {
    return static_cast<std::size_t>(row_chunks(N)) * 2 * channels;
}

template <typename E>
void layernorm_backward(E* dinp, Ptr dweight, Ptr dbias, float* scratch, const E* dout,
                        const E* inp, const E* weight, const float* mean, const float* rstd, int N,
                        int channels, cudaStream_t stream) {
    if (N == 0) return;
    if (dinp) {
        layernorm_backward_input_kernel<<<row_blocks(N), kRowThreads, 0, stream>>>(
            dinp, dout, inp, weight, mean, rstd, N, channels);
        TRIDENT_CUDA_CHECK_LAUNCH();
    }
    if (!dweight) return;
    require_float_elements(dweight.dtype, "a LayerNorm weight gradient");
    require_float_elements(dbias.dtype, "a LayerNorm bias gradient");
    const unsigned column_blocks =
        static_cast<unsigned>((channels + kColumnThreads - 1) / kColumnThreads);
    const dim3 grid(column_blocks, static_cast<unsigned>(row_chunks(N)));
    layernorm_param_partials_kernel<<<grid, kColumnThreads, 0, stream>>>(
        scratch, dout, inp, mean, rstd, N, channels, rows_per_chunk(N));
    TRIDENT_CUDA_CHECK_LAUNCH();
    add_column_partials_kernel<2><<<column_blocks, kColumnThreads, 0, stream>>>(
        {{dweight, dbias}}, scratch, row_chunks(N), channels);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

#define TRIDENT_INSTANTIATE(E)                                                                     \
    template void layernorm_forward<E>(E*, float*, float*, const E*, const E*, const E*, int, int, \
                                       cudaStream_t);                                              \
    template void residual_layernorm_forward<E>(E*, E*, float*, float*, const E*, const E*,        \
                                                const E*, const E*, int, int, cudaStream_t);       \
    template void layernorm_backward<E>(E*, Ptr, Ptr, float*, const E*, const E*, const E*,        \
                                        const float*, const float*, int, int, cudaStream_t);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(__nv_bfloat16)
TRIDENT_INSTANTIATE(__half)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::kernels::cuda
