// Vocab-parallel softmax cross-entropy over the LM head's logits (kernels/ops.h has the
// three-step protocol): the partials pass reads every logit once, keeping per thread a running
// max and a sum of exponentials relative to it (the online softmax), combined over the block
// in a fixed tree; rescale and losses touch N numbers; backward writes every logit's gradient
// from its value and the row's log-sum-exp, so the probabilities are never stored.
#include <cmath>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/elements.cuh"

namespace trident::kernels::cuda {

namespace {

constexpr int kThreads = 512;

// The slice's real columns are [0, real): real tokens only, then padding.
__host__ __device__ int real_columns(int vocab_begin, int V, int Vp_local) {
    const int real = V - vocab_begin;
    return real < 0 ? 0 : (real > Vp_local ? Vp_local : real);
}

// (max, sum of exp(x - max)) pairs, merged. An empty side (sum 0) contributes nothing, which
// also keeps exp(-inf - -inf) = NaN out.
struct MaxSum {
    float max, sum;
};
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
    if (b.sum == 0.0f) return a;
    if (a.sum == 0.0f) return b;
    const float m = fmaxf(a.max, b.max);
    return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

// One block per row.
template <typename E>
__global__ void partials_kernel(float* row_max, float* row_sumexp, float* target_logit,
                                const E* logits, const int32_t* targets, int real, int vocab_begin,
                                int Vp_local) {
    __shared__ MaxSum shared[kThreads / 32];
    const int n = blockIdx.x;
    const E* row = logits + static_cast<std::size_t>(n) * Vp_local;
    MaxSum mine{-INFINITY, 0.0f};
    for (int c = threadIdx.x; c < real; c += blockDim.x) {
        const float x = to_float(row[c]);
        if (x > mine.max) {
            mine.sum = mine.sum * expf(mine.max - x) + 1.0f;
            mine.max = x;
        } else {
            mine.sum += expf(x - mine.max);
        }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        const MaxSum other{__shfl_xor_sync(0xffffffffu, mine.max, offset),
                           __shfl_xor_sync(0xffffffffu, mine.sum, offset)};
        mine = merge(mine, other);
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) shared[warp] = mine;
    __syncthreads();
    if (warp == 0) {
        mine = lane < static_cast<int>(blockDim.x / 32) ? shared[lane] : MaxSum{-INFINITY, 0.0f};
        for (int offset = 16; offset > 0; offset /= 2) {
            const MaxSum other{__shfl_xor_sync(0xffffffffu, mine.max, offset),
                               __shfl_xor_sync(0xffffffffu, mine.sum, offset)};
            mine = merge(mine, other);
        }
        if (lane == 0) {
            row_max[n] = real > 0 ? mine.max : -INFINITY;
            row_sumexp[n] = mine.sum;
            const int target = targets[n] - vocab_begin;
            target_logit[n] = target >= 0 && target < real ? to_float(row[target]) : 0.0f;
        }
    }
}

__global__ void rescale_kernel(float* row_sumexp, const float* row_max, const float* global_max,
                               int N) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    row_sumexp[n] = row_sumexp[n] > 0.0f ? row_sumexp[n] * expf(row_max[n] - global_max[n]) : 0.0f;
}

__global__ void losses_kernel(float* losses, float* lse, const float* global_max,
                              const float* row_sumexp, const float* target_logit, int N) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const float row_lse = global_max[n] + logf(row_sumexp[n]);
    lse[n] = row_lse;
    losses[n] = row_lse - target_logit[n];
}

// dlogits = (exp(logit - lse) - [column == target]) * dloss on real columns, 0 on padding;
// one block per row, element by element, so dlogits may be logits.
template <typename E>
__global__ void backward_kernel(E* dlogits, const E* logits, const float* lse,
                                const int32_t* targets, float dloss, int real, int vocab_begin,
                                int Vp_local) {
    const int n = blockIdx.x;
    const std::size_t offset = static_cast<std::size_t>(n) * Vp_local;
    const float row_lse = lse[n];
    const int target = targets[n] - vocab_begin;
    for (int c = threadIdx.x; c < Vp_local; c += blockDim.x) {
        float d = 0.0f;
        if (c < real) {
            d = expf(to_float(logits[offset + c]) - row_lse) * dloss;
            if (c == target) d -= dloss;
        }
        dlogits[offset + c] = from_float<E>(d);
    }
}

// *total += the mean of losses (N), by one block: each thread sums a strided share in
// double, the block adds the shares in a fixed tree, and the mean is rounded to fp32 as the
// CPU backend rounds it.
__global__ void add_mean_kernel(double* total, const float* losses, int N) {
    __shared__ double shared[32];
    double sum = 0.0;
    for (int n = threadIdx.x; n < N; n += blockDim.x) sum += losses[n];
    sum = block_sum(sum, shared);
    if (threadIdx.x == 0) *total += static_cast<double>(static_cast<float>(sum / N));
}

unsigned small_blocks(int N) {
    return static_cast<unsigned>((N + 255) / 256);
}

}  // namespace

template <typename E>
void cross_entropy_partials(float* row_max, float* row_sumexp, float* target_logit, const E* logits,
                            const int32_t* targets, int N, int vocab_begin, int V, int Vp_local,
                            cudaStream_t stream) {
    if (N == 0) return;
    partials_kernel<<<N, kThreads, 0, stream>>>(row_max, row_sumexp, target_logit, logits, targets,
                                                real_columns(vocab_begin, V, Vp_local), vocab_begin,
                                                Vp_local);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

void cross_entropy_rescale(float* row_sumexp, const float* row_max, const float* global_max, int N,
                           cudaStream_t stream) {
    if (N == 0) return;
    rescale_kernel<<<small_blocks(N), 256, 0, stream>>>(row_sumexp, row_max, global_max, N);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

void cross_entropy_losses(float* losses, float* lse, const float* global_max,
                          const float* row_sumexp, const float* target_logit, int N,
                          cudaStream_t stream) {
    if (N == 0) return;
    losses_kernel<<<small_blocks(N), 256, 0, stream>>>(losses, lse, global_max, row_sumexp,
                                                       target_logit, N);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

void add_mean(double* total, const float* losses, int N, cudaStream_t stream) {
    if (N == 0) return;
    add_mean_kernel<<<1, kThreads, 0, stream>>>(total, losses, N);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

template <typename E>
void cross_entropy_backward(E* dlogits, const E* logits, const float* lse, const int32_t* targets,
                            float dloss, int N, int vocab_begin, int V, int Vp_local,
                            cudaStream_t stream) {
    if (N == 0) return;
    backward_kernel<<<N, kThreads, 0, stream>>>(dlogits, logits, lse, targets, dloss,
                                                real_columns(vocab_begin, V, Vp_local), vocab_begin,
                                                Vp_local);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

#define TRIDENT_INSTANTIATE(E)                                                                     \
    template void cross_entropy_partials<E>(float*, float*, float*, const E*, const int32_t*, int, \
                                            int, int, int, cudaStream_t);                          \
    template void cross_entropy_backward<E>(E*, const E*, const float*, const int32_t*, float,     \
                                            int, int, int, int, cudaStream_t);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(__nv_bfloat16)
TRIDENT_INSTANTIATE(__half)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::kernels::cuda
