// Vocab-parallel softmax cross-entropy over the LM head's logits (kernels/ops.h has the
// three-step protocol): the partials pass reads every logit once, keeping per thread a running
// max and a sum of exponentials relative to it (the online softmax), combined over the block
// in a fixed tree; rescale and losses touch N numbers; backward reads every logit once and
// writes its gradient from its value and the row's log-sum-exp, so the probabilities are
// never stored. Both passes over the logits are memory-bound: one block per row, each thread
// taking 16-byte packs (two at a time, so that two loads are in flight), elements one by one
// only where the rows do not allow whole packs (Vp_local not a multiple of the pack, an
// unaligned buffer).
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

// x = the P elements of a pack at p as float: elements from `valid` on (past the row's real
// columns) are `fill`. `vector`: the pack may be read whole (16-byte aligned and inside the
// row); else only the valid elements are read.
template <typename E>
__device__ __forceinline__ void load_floats(float (&x)[kPack<E>], const E* p, int valid,
                                            bool vector, float fill) {
    if (vector) {
        const Pack<E> v = load_pack(p);
#pragma unroll
        for (int e = 0; e < kPack<E>; ++e) x[e] = e < valid ? to_float(v.v[e]) : fill;
    } else {
#pragma unroll
        for (int e = 0; e < kPack<E>; ++e) x[e] = e < valid ? to_float(p[e]) : fill;
    }
}

// Adds a pack's elements to a running (max, sum): the max moves once per pack.
template <int P>
__device__ __forceinline__ void add_pack(MaxSum& mine, const float (&x)[P]) {
    float m = x[0];
#pragma unroll
    for (int e = 1; e < P; ++e) m = fmaxf(m, x[e]);
    if (m == -INFINITY) return;  // nothing real in the pack
    if (m > mine.max) {
        mine.sum = mine.sum > 0.0f ? mine.sum * expf(mine.max - m) : 0.0f;
        mine.max = m;
    }
#pragma unroll
    for (int e = 0; e < P; ++e) mine.sum += expf(x[e] - mine.max);  // -inf adds 0
}

// The block's merge of its threads' (max, sum), in a fixed tree; thread 0 gets the total.
__device__ MaxSum block_merge(MaxSum mine) {
    __shared__ MaxSum shared[kThreads / 32];
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
    }
    return mine;
}

// One block per row; thread t takes packs t, t + kThreads, ... of the real columns, two per
// step.
template <typename E>
__global__ void __launch_bounds__(kThreads)
    partials_kernel(float* row_max, float* row_sumexp, float* target_logit, const E* logits,
                    const int32_t* targets, int real, int vocab_begin, int Vp_local, bool vector) {
    constexpr int P = kPack<E>;
    const int n = blockIdx.x;
    const E* row = logits + static_cast<std::size_t>(n) * Vp_local;
    const int packs = (real + P - 1) / P;
    MaxSum mine{-INFINITY, 0.0f};
    for (int p = threadIdx.x; p < packs; p += 2 * kThreads) {
        const int q = p + kThreads;  // the second pack of the step, if any
        float x[P], y[P];
        load_floats<E>(x, row + p * P, real - p * P, vector, -INFINITY);
        if (q < packs) load_floats<E>(y, row + q * P, real - q * P, vector, -INFINITY);
        add_pack(mine, x);
        if (q < packs) add_pack(mine, y);
    }
    mine = block_merge(mine);
    if (threadIdx.x == 0) {
        row_max[n] = real > 0 ? mine.max : -INFINITY;
        row_sumexp[n] = mine.sum;
        const int target = targets[n] - vocab_begin;
        target_logit[n] = target >= 0 && target < real ? to_float(row[target]) : 0.0f;
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

// The gradients of one pack at column c from its logits x: (exp(x - lse) - [column ==
// target]) * dloss on real columns, 0 on padding.
template <typename E>
__device__ __forceinline__ Pack<E> gradient_pack(const float (&x)[kPack<E>], int c, int real,
                                                 int target, float row_lse, float dloss) {
    Pack<E> d;
#pragma unroll
    for (int e = 0; e < kPack<E>; ++e) {
        float g = 0.0f;
        if (c + e < real) {
            g = expf(x[e] - row_lse) * dloss;
            if (c + e == target) g -= dloss;
        }
        d.v[e] = from_float<E>(g);
    }
    return d;
}

template <typename E>
__device__ __forceinline__ void store_elements(E* p, const Pack<E>& d, int valid, bool vector) {
    if (vector) {
        store_pack(p, d);
    } else {
#pragma unroll
        for (int e = 0; e < kPack<E>; ++e)
            if (e < valid) p[e] = d.v[e];
    }
}

// One block per row, two packs per thread and step, both read before either is written: each
// pack is read and written by one thread, so dlogits may be logits.
template <typename E>
__global__ void __launch_bounds__(kThreads)
    backward_kernel(E* dlogits, const E* logits, const float* lse, const int32_t* targets,
                    float dloss, int real, int vocab_begin, int Vp_local, bool vector) {
    constexpr int P = kPack<E>;
    const int n = blockIdx.x;
    const std::size_t offset = static_cast<std::size_t>(n) * Vp_local;
    const float row_lse = lse[n];
    const int target = targets[n] - vocab_begin;
    const int packs = (Vp_local + P - 1) / P;
    for (int p = threadIdx.x; p < packs; p += 2 * kThreads) {
        const int q = p + kThreads;
        float x[P], y[P];
        load_floats<E>(x, logits + offset + p * P, Vp_local - p * P, vector, 0.0f);
        if (q < packs) load_floats<E>(y, logits + offset + q * P, Vp_local - q * P, vector, 0.0f);
        store_elements(dlogits + offset + p * P,
                       gradient_pack<E>(x, p * P, real, target, row_lse, dloss), Vp_local - p * P,
                       vector);
        if (q < packs)
            store_elements(dlogits + offset + q * P,
                           gradient_pack<E>(y, q * P, real, target, row_lse, dloss),
                           Vp_local - q * P, vector);
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
    const bool vector = Vp_local % kPack<E> == 0 && pack_aligned(logits);
    partials_kernel<<<N, kThreads, 0, stream>>>(row_max, row_sumexp, target_logit, logits, targets,
                                                real_columns(vocab_begin, V, Vp_local), vocab_begin,
                                                Vp_local, vector);
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
    const bool vector = Vp_local % kPack<E> == 0 && pack_aligned(logits) && pack_aligned(dlogits);
    backward_kernel<<<N, kThreads, 0, stream>>>(dlogits, logits, lse, targets, dloss,
                                                real_columns(vocab_begin, V, Vp_local), vocab_begin,
                                                Vp_local, vector);
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
