// Layer normalisation over the channels of each row (eps 1e-5, biased variance, as torch),
// forward (optionally with the residual add before it fused in) and backward.
//
// One warp per row, in 16-byte packs (row_packs.cuh): lane l takes packs l, l + 32, ... of the
// row, so each load instruction of the warp reads 512 adjacent bytes. A row is read from
// memory once; its later passes (the variance, the output; the input's gradient) read it again
// from the L1 cache, which holds the rows of the warps an SM runs, rather than from registers,
// which would cap the row's width and the warps an SM can keep in flight. The variance is the
// mean of (x - mean)^2, which does not cancel when |mean| >> std.
//
// The backward is one pass over the rows: a block takes a fixed chunk of rows, each warp a row
// at a time, adding the input's gradient and keeping the parameters' column sums of its rows
// in shared memory of its own; the block adds its warps' sums in order and writes the chunk's,
// which column_partials.cuh adds in order into the gradients. No atomics: a run repeats bit for
// bit. Rows so wide that a block's sums do not fit in shared memory (over ~7,000 channels) take
// a second kernel for the parameters, a thread per column.
#include <algorithm>
#include <initializer_list>

#include "kernels/cuda/column_partials.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/elements.cuh"
#include "kernels/cuda/row_packs.cuh"

namespace trident::kernels::cuda {

namespace {

constexpr float kEps = 1e-5f;
constexpr int kWarps = 4;  // rows in flight per block
constexpr int kThreads = 32 * kWarps;

// out (N,channels) = (x - mean) * rstd * weight + bias with x = inp (`b`), or with x = residual =
// a + b (written, rounded) when `a` is given; mean, rstd (N).
template <typename E>
__global__ void __launch_bounds__(kThreads)
    layernorm_forward_kernel(E* out, float* mean, float* rstd, E* residual, const E* a, const E* b,
                             const E* weight, const E* bias, int N, int channels, bool vector) {
    constexpr int P = kPack<E>;
    const int row = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const std::size_t offset = static_cast<std::size_t>(row) * channels;
    const int packs = (channels + P - 1) / P;
    const E* x = a != nullptr ? residual + offset : b + offset;
    float sum = 0.0f;  // the zeros past channels add nothing
#pragma unroll 4
    for (int p = lane; p < packs; p += 32) {
        Pack<E> v = row_pack(b + offset, p * P, channels, vector);
        if (a != nullptr) {
            // Each lane rereads only what it writes here itself: no barrier is needed.
            const Pack<E> u = row_pack(a + offset, p * P, channels, vector);
#pragma unroll
            for (int e = 0; e < P; ++e) v.v[e] = from_float<E>(to_float(u.v[e]) + to_float(v.v[e]));
            store_row_pack(residual + offset, p * P, v, channels, vector);
        }
#pragma unroll
        for (int e = 0; e < P; ++e) sum += to_float(v.v[e]);
    }
    const float m = warp_sum(sum) / channels;
    float sum_sq = 0.0f;
#pragma unroll 4
    for (int p = lane; p < packs; p += 32) {
        const Pack<E> v = row_pack(x, p * P, channels, vector);
#pragma unroll
        for (int e = 0; e < P; ++e) {
            const float d = to_float(v.v[e]) - m;
            if (p * P + e < channels) sum_sq += d * d;
        }
    }
    const float s = 1.0f / sqrtf(warp_sum(sum_sq) / channels + kEps);
#pragma unroll 4
    for (int p = lane; p < packs; p += 32) {
        const int c = p * P;
        Pack<E> v = row_pack(x, c, channels, vector);
        const Pack<E> w = row_pack(weight, c, channels, vector),
                      shift = row_pack(bias, c, channels, vector);
#pragma unroll
        for (int e = 0; e < P; ++e)
            v.v[e] =
                from_float<E>((to_float(v.v[e]) - m) * s * to_float(w.v[e]) + to_float(shift.v[e]));
        store_row_pack(out + offset, c, v, channels, vector);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

// What the backward reads of one pack of a row: the input, the output's gradient, the weight.
template <typename E>
struct BackwardPacks {
    Pack<E> x, dy, w;
};
template <typename E>
__device__ __forceinline__ BackwardPacks<E> backward_packs(const E* inp, const E* dout,
                                                           const E* weight, int c, int channels,
                                                           bool vector) {
    return {row_pack(inp, c, channels, vector), row_pack(dout, c, channels, vector),
            row_pack(weight, c, channels, vector)};
}

// Floats of one warp's parameter sums: (dweight, dbias) for each of its lanes' columns.
template <typename E>
__host__ __device__ int sum_slots(int channels) {
    return packs_per_lane<E>(channels) * kPack<E> * 32;
}

// Over chunk blockIdx.x of chunk_rows rows, with norm = (x - mean) * rstd and
// dnorm = dout * weight:
//   dinp += rstd * (dnorm - mean_c(dnorm) - norm * mean_c(dnorm * norm))   (unless dinp is null)
// and, with `partial`, the chunk's column sums of dout * norm and dout into partial (chunks, 2,
// channels). Dynamic shared memory (with partial): kWarps x 2 x sum_slots floats, a warp's sums
// laid out [q][k][e][lane] for its lane's k-th pack, so that its 32 lanes touch 32 banks.
template <typename E>
__global__ void __launch_bounds__(kThreads)
    layernorm_backward_kernel(E* dinp, float* partial, const E* dout, const E* inp, const E* weight,
                              const float* mean, const float* rstd, int N, int channels,
                              int chunk_rows, bool vector) {
    extern __shared__ float sums[];
    constexpr int P = kPack<E>;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int lane_packs = packs_per_lane<E>(channels), slots = sum_slots<E>(channels);
    float* dw = sums + 2 * warp * slots;
    float* db = dw + slots;
    if (partial) {
        for (int i = threadIdx.x; i < 2 * kWarps * slots; i += kThreads) sums[i] = 0.0f;
        __syncthreads();
    }
    const int first = blockIdx.x * chunk_rows, end = min(N, first + chunk_rows);
    for (int row = first + warp; row < end; row += kWarps) {
        const std::size_t offset = static_cast<std::size_t>(row) * channels;
        const float m = mean[row], s = rstd[row];
        float dnorm_sum = 0.0f,
              dnorm_norm_sum = 0.0f;  // past channels, dout is zero: nothing added
#pragma unroll 2
        for (int k = 0; k < lane_packs; ++k) {
            const int c = pack_column<E>(lane, k);
            if (c >= channels) continue;
            const BackwardPacks<E> in =
                backward_packs(inp + offset, dout + offset, weight, c, channels, vector);
#pragma unroll
            for (int e = 0; e < P; ++e) {
                const float norm = (to_float(in.x.v[e]) - m) * s, g = to_float(in.dy.v[e]);
                if (partial) {
                    dw[(k * P + e) * 32 + lane] += g * norm;
                    db[(k * P + e) * 32 + lane] += g;
                }
                const float dnorm = g * to_float(in.w.v[e]);
                dnorm_sum += dnorm;
                dnorm_norm_sum += dnorm * norm;
            }
        }
        if (dinp == nullptr) continue;
        const float dnorm_mean = warp_sum(dnorm_sum) / channels;
        const float dnorm_norm_mean = warp_sum(dnorm_norm_sum) / channels;
#pragma unroll 2
        for (int k = 0; k < lane_packs; ++k) {
            const int c = pack_column<E>(lane, k);
            if (c >= channels) continue;
            const BackwardPacks<E> in =
                backward_packs(inp + offset, dout + offset, weight, c, channels, vector);
            Pack<E> dx = row_pack(dinp + offset, c, channels, vector);
#pragma unroll
            for (int e = 0; e < P; ++e) {
                const float norm = (to_float(in.x.v[e]) - m) * s;
                const float dnorm = to_float(in.dy.v[e]) * to_float(in.w.v[e]);
                dx.v[e] = from_float<E>(to_float(dx.v[e]) +
                                        s * (dnorm - dnorm_mean - norm * dnorm_norm_mean));
            }
            store_row_pack(dinp + offset, c, dx, channels, vector);
        }
    }
    if (!partial) return;
    __syncthreads();
    float* chunk = partial + static_cast<std::size_t>(blockIdx.x) * 2 * channels;
    for (int c = threadIdx.x; c < channels; c += kThreads) {
        const int p = c / P, i = (p / 32 * P + c % P) * 32 + p % 32;
        float weight_sum = 0.0f, bias_sum = 0.0f;
        for (int w = 0; w < kWarps; ++w) {  // the warps in order
            weight_sum += sums[2 * w * slots + i];
            bias_sum += sums[(2 * w + 1) * slots + i];
        }
        chunk[c] = weight_sum;
        chunk[channels + c] = bias_sum;
    }
}

// Where a block's sums do not fit in shared memory: partial (chunks, 2, channels) = per chunk of
// row_chunks(N) rows, the column sums of dout * norm (dweight) and of dout (dbias), a thread
// per (chunk, column).
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

// The backward's chunks of rows: a function of N alone, so the sums' order is too; at least
// 16 rows each (4 per warp), and from N = 8192 on 512 of them, which fill a GPU.
int backward_chunks(int N) {
    return std::max(1, std::min(512, (N + 15) / 16));
}

// Whether every given pointer allows 16-byte packs.
bool all_aligned(std::initializer_list<const void*> pointers) {
    for (const void* p : pointers)
        if (p != nullptr && !pack_aligned(p)) return false;
    return true;
}

// The forward of either form: residual and a null for LayerNorm alone.
template <typename E>
void forward(E* residual, E* out, float* mean, float* rstd, const E* a, const E* b, const E* weight,
             const E* bias, int N, int channels, cudaStream_t stream) {
    if (N == 0) return;
    const bool vector =
        channels % kPack<E> == 0 && all_aligned({residual, out, a, b, weight, bias});
    const unsigned blocks = static_cast<unsigned>((N + kWarps - 1) / kWarps);
    layernorm_forward_kernel<<<blocks, kThreads, 0, stream>>>(out, mean, rstd, residual, a, b,
                                                              weight, bias, N, channels, vector);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

// The parameters' partial sums by the per-column kernel, chunks of row_chunks(N) rows.
template <typename E>
void column_partials(float* partial, const E* dout, const E* inp, const float* mean,
                     const float* rstd, int N, int channels, cudaStream_t stream) {
    const unsigned column_blocks =
        static_cast<unsigned>((channels + kColumnThreads - 1) / kColumnThreads);
    const dim3 grid(column_blocks, static_cast<unsigned>(row_chunks(N)));
    layernorm_param_partials_kernel<<<grid, kColumnThreads, 0, stream>>>(
        partial, dout, inp, mean, rstd, N, channels, rows_per_chunk(N));
    TRIDENT_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <typename E>
void layernorm_forward(E* out, float* mean, float* rstd, const E* inp, const E* weight,
                       const E* bias, int N, int channels, cudaStream_t stream) {
    forward(static_cast<E*>(nullptr), out, mean, rstd, static_cast<const E*>(nullptr), inp, weight,
            bias, N, channels, stream);
}

template <typename E>
void residual_layernorm_forward(E* residual, E* out, float* mean, float* rstd, const E* a,
                                const E* b, const E* weight, const E* bias, int N, int channels,
                                cudaStream_t stream) {
    forward(residual, out, mean, rstd, a, b, weight, bias, N, channels, stream);
}

// Enough for either way of summing the parameters (backward_chunks(N) >= row_chunks(N)).
std::size_t layernorm_backward_scratch(int N, int channels) {
    return static_cast<std::size_t>(std::max(backward_chunks(N), row_chunks(N))) * 2 * channels;
}

template <typename E>
void layernorm_backward(E* dinp, Ptr dweight, Ptr dbias, float* scratch, const E* dout,
                        const E* inp, const E* weight, const float* mean, const float* rstd, int N,
                        int channels, cudaStream_t stream) {
    if (N == 0 || (!dinp && !dweight)) return;
    if (dweight) {
        require_float_elements(dweight.dtype, "a LayerNorm weight gradient");
        require_float_elements(dbias.dtype, "a LayerNorm bias gradient");
    }
    const std::size_t shared = 2 * kWarps * static_cast<std::size_t>(sum_slots<E>(channels)) * 4;
    const bool in_block = dweight && shared <= gpu_properties().sharedMemPerBlockOptin;
    const int chunks = backward_chunks(N), chunk_rows = (N + chunks - 1) / chunks;
    const bool vector = channels % kPack<E> == 0 && all_aligned({dinp, dout, inp, weight});
    if (in_block && shared > 48 * 1024)
        TRIDENT_CUDA_CHECK(cudaFuncSetAttribute(layernorm_backward_kernel<E>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(shared)));
    if (dinp || in_block) {
        layernorm_backward_kernel<<<static_cast<unsigned>(chunks), kThreads, in_block ? shared : 0,
                                    stream>>>(dinp, in_block ? scratch : nullptr, dout, inp, weight,
                                              mean, rstd, N, channels, chunk_rows, vector);
        TRIDENT_CUDA_CHECK_LAUNCH();
    }
    if (!dweight) return;
    if (!in_block) column_partials(scratch, dout, inp, mean, rstd, N, channels, stream);
    add_column_partials<2>({{dweight, dbias}}, scratch, in_block ? chunks : row_chunks(N), channels,
                           stream);
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
