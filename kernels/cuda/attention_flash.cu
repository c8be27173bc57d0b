// Causal self-attention that never writes the T x T score matrix ("flash attention"): the
// GPU backend's own kernels, used where cuDNN's fused attention has no engine (fp32, head
// sizes it refuses, attention dropout, whose mask must be Trident's) and as the reference the
// cuDNN path is tested against.
//
// Forward, per (batch, head, block of 64 query rows): K and V stream through shared memory 32
// rows at a time; each query row keeps a running max m, a running sum l of exp(score - m) and
// an unnormalised output, rescaled when m grows (the online softmax), and ends with
// out = o / l and lse = m + log l, the only per-row number backward needs.
//
// Backward recomputes the probabilities p = exp(score - lse) tile by tile. With
// D_i = dout_i . out_i (= sum_j p_ij * dp_ij, dropout included) and z the dropout factor:
//   dv_j += p_ij z_ij dout_i,   ds_ij = p_ij (z_ij dout_i . v_j - D_i),
//   dk_j += scale ds_ij q_i,    dq_i += scale ds_ij k_j.
// dk, dv are summed by one kernel over blocks of keys and dq by another over blocks of
// queries, each element by one thread in a fixed order: no atomics, so runs repeat bit for bit.
//
// Threads and registers as attention_tiles.cuh lays them out (Split threads a row, 32 dims a
// thread). All arithmetic is fp32 on CUDA cores; element types are converted where tiles are
// loaded and results stored, so one instantiation per Split serves fp32, bf16 and fp16. The
// dropout mask is the model's: element (b, head_begin + h, i, j) of (B, heads_total, T, T), as
// in kernels/ops.h.
#include <cmath>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_tiles.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dropout.cuh"
#include "kernels/cuda/elements.cuh"

namespace trident::kernels::cuda {

namespace {

constexpr int kQueryRows = 64;  // query rows per block (forward, dq)
constexpr int kKeyRows = 64;    // key rows per block (dk, dv)

struct Geometry {
    int B, T, C, NH, hs, heads_total, head_begin;
    float scale, drop_prob, keep_scale;
    uint64_t seed;
    DType type;

    // Element offsets: q of head h of batch b at row 0 in qkv (B,T,3C); k is C further, v 2C.
    __device__ std::size_t q_base(int b, int h) const {
        return static_cast<std::size_t>(b) * T * 3 * C + static_cast<std::size_t>(h) * hs;
    }
    // Head h of batch b at row 0 in out or dout (B,T,C).
    __device__ std::size_t out_base(int b, int h) const {
        return static_cast<std::size_t>(b) * T * C + static_cast<std::size_t>(h) * hs;
    }
    // Row i of head h of batch b in lse and the row dots (B,NH,T).
    __device__ std::size_t stat(int b, int h, int i) const {
        return (static_cast<std::size_t>(b) * NH + h) * T + i;
    }
    // Dropout index of (b, h, i, 0) in the model's (B, heads_total, T, T).
    __device__ uint64_t mask_row(int b, int h, int i) const {
        return ((static_cast<uint64_t>(b) * heads_total + head_begin + h) * T + i) * T;
    }
    __device__ float dropout_factor(uint64_t index) const {
        if (drop_prob == 0.0f) return 1.0f;
        return dropout_kept(seed, index, drop_prob) ? keep_scale : 0.0f;
    }
    // The T rows of a (T, stride) matrix starting at element `base` of src.
    __device__ Rows rows(const void* src, std::size_t base, std::size_t stride) const {
        return Rows{src, type, base, stride, T, hs};
    }
};

// dst[row] += x over this thread's dims.
template <int Split>
__device__ void add_row(void* dst, const float (&x)[kDimsPerThread], const Geometry& g,
                        std::size_t base, std::size_t stride, int row, int s) {
#pragma unroll
    for (int k = 0; k < kDimsPerThread; ++k) {
        const int d = k * Split + s;
        if (d < g.hs) {
            const std::size_t i = base + row * stride + d;
            store_from_float(dst, g.type, i, load_as_float(dst, g.type, i) + x[k]);
        }
    }
}

// out (B,T,C) (null: statistics only) and lse (B,NH,T). Grid (T/64, NH, B).
template <int Split>
__global__ void __launch_bounds__(kQueryRows* Split)
    forward_kernel(void* out, float* lse, const void* qkv, Geometry g) {
    constexpr int D = kDimsPerThread * Split;
    __shared__ float keys[kTile * D], values[kTile * D];
    const int b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * kQueryRows;
    const int s = threadIdx.x % Split, i = i0 + threadIdx.x / Split;
    const std::size_t stride = 3 * static_cast<std::size_t>(g.C), q_base = g.q_base(b, h);
    float q[kDimsPerThread], o[kDimsPerThread] = {};
    load_row<Split>(q, g.rows(qkv, q_base, stride), i, s);
    const uint64_t mask_row = g.mask_row(b, h, i);
    float m = -INFINITY, l = 0.0f;
    const int key_end = min(g.T, i0 + kQueryRows);
    for (int j0 = 0; j0 < key_end; j0 += kTile) {
        __syncthreads();  // the previous tiles are used up
        load_tile<D>(keys, g.rows(qkv, q_base + g.C, stride), j0);
        if (out) load_tile<D>(values, g.rows(qkv, q_base + 2 * g.C, stride), j0);
        __syncthreads();
        float score[kTile];
        float tile_max = -INFINITY;
#pragma unroll
        for (int j = 0; j < kTile; ++j) {
            float dot = 0.0f;
#pragma unroll
            for (int k = 0; k < kDimsPerThread; ++k) dot += q[k] * keys[j * D + k * Split + s];
            dot = group_sum<Split>(dot) * g.scale;
            score[j] = j0 + j <= i && j0 + j < g.T ? dot : -INFINITY;
            tile_max = fmaxf(tile_max, score[j]);
        }
        const float m_new = fmaxf(m, tile_max);
        if (m_new == -INFINITY) continue;     // no key yet for this row (a row past T)
        const float alpha = expf(m - m_new);  // 0 on the first tile (m = -inf)
        l *= alpha;
#pragma unroll
        for (int k = 0; k < kDimsPerThread; ++k) o[k] *= alpha;
#pragma unroll
        for (int j = 0; j < kTile; ++j) {
            const float p = expf(score[j] - m_new);  // 0 for masked keys
            l += p;
            if (out) {
                const float weight = p * g.dropout_factor(mask_row + j0 + j);
#pragma unroll
                for (int k = 0; k < kDimsPerThread; ++k)
                    o[k] += weight * values[j * D + k * Split + s];
            }
        }
        m = m_new;
    }
    if (i >= g.T) return;
    if (out) {
        const float inv = 1.0f / l;
#pragma unroll
        for (int k = 0; k < kDimsPerThread; ++k) {
            const int d = k * Split + s;
            if (d < g.hs)
                store_from_float(out, g.type,
                                 g.out_base(b, h) + static_cast<std::size_t>(i) * g.C + d,
                                 o[k] * inv);
        }
    }
    if (s == 0) lse[g.stat(b, h, i)] = m + logf(l);
}

// row_dot (B,NH,T) = dout . out per row and head: one warp per row.
__global__ void row_dot_kernel(float* row_dot, const void* dout, const void* out, Geometry g) {
    const std::size_t row =
        static_cast<std::size_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= static_cast<std::size_t>(g.B) * g.NH * g.T) return;
    const int i = static_cast<int>(row % g.T);
    const int h = static_cast<int>(row / g.T % g.NH);
    const int b = static_cast<int>(row / g.T / g.NH);
    const std::size_t base = g.out_base(b, h) + static_cast<std::size_t>(i) * g.C;
    float sum = 0.0f;
    for (int d = lane; d < g.hs; d += 32)
        sum += load_as_float(dout, g.type, base + d) * load_as_float(out, g.type, base + d);
    sum = warp_sum(sum);
    if (lane == 0) row_dot[row] = sum;
}

// dk, dv of a block of 64 keys: the query tiles from the key block's diagonal on stream
// through shared memory. Grid (T/64, NH, B).
template <int Split>
__global__ void __launch_bounds__(kKeyRows* Split)
    backward_kv_kernel(void* dqkv, const void* dout, const void* qkv, const float* lse,
                       const float* row_dot, Geometry g) {
    constexpr int D = kDimsPerThread * Split;
    __shared__ float queries[kTile * D], grads[kTile * D], tile_lse[kTile], tile_dot[kTile];
    const int b = blockIdx.z, h = blockIdx.y, j0 = blockIdx.x * kKeyRows;
    const int s = threadIdx.x % Split, j = j0 + threadIdx.x / Split;
    const std::size_t stride = 3 * static_cast<std::size_t>(g.C), q_base = g.q_base(b, h);
    const std::size_t out_base = g.out_base(b, h);
    float key[kDimsPerThread], value[kDimsPerThread];
    float dk[kDimsPerThread] = {}, dv[kDimsPerThread] = {};
    load_row<Split>(key, g.rows(qkv, q_base + g.C, stride), j, s);
    load_row<Split>(value, g.rows(qkv, q_base + 2 * g.C, stride), j, s);
    for (int i0 = j0 / kTile * kTile; i0 < g.T; i0 += kTile) {
        __syncthreads();
        load_tile<D>(queries, g.rows(qkv, q_base, stride), i0);
        load_tile<D>(grads, g.rows(dout, out_base, g.C), i0);
        for (int r = threadIdx.x; r < kTile; r += blockDim.x) {
            const bool real = i0 + r < g.T;
            tile_lse[r] = real ? lse[g.stat(b, h, i0 + r)] : 0.0f;
            tile_dot[r] = real ? row_dot[g.stat(b, h, i0 + r)] : 0.0f;
        }
        __syncthreads();
        for (int r = 0; r < kTile; ++r) {
            float qk = 0.0f, gv = 0.0f;
#pragma unroll
            for (int k = 0; k < kDimsPerThread; ++k) {
                qk += queries[r * D + k * Split + s] * key[k];
                gv += grads[r * D + k * Split + s] * value[k];
            }
            qk = group_sum<Split>(qk);
            gv = group_sum<Split>(gv);
            const int i = i0 + r;
            if (i < j || i >= g.T || j >= g.T) continue;
            const float p = expf(qk * g.scale - tile_lse[r]);
            const float z = g.dropout_factor(g.mask_row(b, h, i) + j);
            const float ds = p * (gv * z - tile_dot[r]);
#pragma unroll
            for (int k = 0; k < kDimsPerThread; ++k) {
                dv[k] += p * z * grads[r * D + k * Split + s];
                dk[k] += g.scale * ds * queries[r * D + k * Split + s];
            }
        }
    }
    if (j >= g.T) return;
    add_row<Split>(dqkv, dk, g, q_base + g.C, stride, j, s);
    add_row<Split>(dqkv, dv, g, q_base + 2 * g.C, stride, j, s);
}

// dq of a block of 64 queries: the key tiles up to the diagonal stream through shared
// memory. Grid (T/64, NH, B).
template <int Split>
__global__ void __launch_bounds__(kQueryRows* Split)
    backward_q_kernel(void* dqkv, const void* dout, const void* qkv, const float* lse,
                      const float* row_dot, Geometry g) {
    constexpr int D = kDimsPerThread * Split;
    __shared__ float keys[kTile * D], values[kTile * D];
    const int b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * kQueryRows;
    const int s = threadIdx.x % Split, i = i0 + threadIdx.x / Split;
    const std::size_t stride = 3 * static_cast<std::size_t>(g.C), q_base = g.q_base(b, h);
    float q[kDimsPerThread], grad[kDimsPerThread], dq[kDimsPerThread] = {};
    load_row<Split>(q, g.rows(qkv, q_base, stride), i, s);
    load_row<Split>(grad, g.rows(dout, g.out_base(b, h), g.C), i, s);
    const float row_lse = i < g.T ? lse[g.stat(b, h, i)] : 0.0f;
    const float dot_i = i < g.T ? row_dot[g.stat(b, h, i)] : 0.0f;
    const uint64_t mask_row = g.mask_row(b, h, i);
    const int key_end = min(g.T, i0 + kQueryRows);
    for (int j0 = 0; j0 < key_end; j0 += kTile) {
        __syncthreads();
        load_tile<D>(keys, g.rows(qkv, q_base + g.C, stride), j0);
        load_tile<D>(values, g.rows(qkv, q_base + 2 * g.C, stride), j0);
        __syncthreads();
        for (int j = 0; j < kTile; ++j) {
            float qk = 0.0f, gv = 0.0f;
#pragma unroll
            for (int k = 0; k < kDimsPerThread; ++k) {
                qk += q[k] * keys[j * D + k * Split + s];
                gv += grad[k] * values[j * D + k * Split + s];
            }
            qk = group_sum<Split>(qk);
            gv = group_sum<Split>(gv);
            const int key = j0 + j;
            if (key > i || key >= g.T || i >= g.T) continue;
            const float p = expf(qk * g.scale - row_lse);
            const float ds = p * (gv * g.dropout_factor(mask_row + key) - dot_i);
#pragma unroll
            for (int k = 0; k < kDimsPerThread; ++k)
                dq[k] += g.scale * ds * keys[j * D + k * Split + s];
        }
    }
    if (i < g.T) add_row<Split>(dqkv, dq, g, q_base, stride, i, s);
}

template <typename E>
Geometry geometry(int B, int T, int C, int NH, float drop_prob, uint64_t seed, int head_begin,
                  int heads_total) {
    const int hs = C / NH;
    // A thread holds kDimsPerThread dims of a row and at most 4 threads share it: larger heads
    // would lose their last dims. Start-up refuses such a model (cuda_ops.h); this guards the
    // kernels themselves.
    if (!flash_attention_supports(hs))
        throw Error("the flash-attention kernels take head sizes 1 to " +
                    std::to_string(kFlashMaxHeadSize) + ", not " + std::to_string(hs));
    return Geometry{B,          T,
                    C,          NH,
                    hs,         heads_total,
                    head_begin, 1.0f / std::sqrt(static_cast<float>(hs)),
                    drop_prob,  1.0f / (1.0f - drop_prob),
                    seed,       dtype_of<E>()};
}

dim3 blocks(const Geometry& g, int rows) {
    return dim3(static_cast<unsigned>((g.T + rows - 1) / rows), static_cast<unsigned>(g.NH),
                static_cast<unsigned>(g.B));
}

}  // namespace

bool flash_attention_supports(int head_size) {
    return head_size >= 1 && head_size <= kFlashMaxHeadSize;
}

template <typename E>
void flash_attention_forward(E* out, float* lse, const E* qkv, int B, int T, int C, int NH,
                             float drop_prob, uint64_t seed, int head_begin, int heads_total,
                             cudaStream_t stream) {
    if (B * T == 0) return;
    const Geometry g = geometry<E>(B, T, C, NH, drop_prob, seed, head_begin, heads_total);
    switch (split_of(g.hs)) {
        case 1:
            forward_kernel<1><<<blocks(g, kQueryRows), kQueryRows, 0, stream>>>(out, lse, qkv, g);
            break;
        case 2:
            forward_kernel<2>
                <<<blocks(g, kQueryRows), kQueryRows * 2, 0, stream>>>(out, lse, qkv, g);
            break;
        default:
            forward_kernel<4>
                <<<blocks(g, kQueryRows), kQueryRows * 4, 0, stream>>>(out, lse, qkv, g);
    }
    TRIDENT_CUDA_CHECK_LAUNCH();
}

template <typename E>
void flash_attention_backward(E* dqkv, float* row_dot, const E* dout, const E* qkv, const E* out,
                              const float* lse, int B, int T, int C, int NH, float drop_prob,
                              uint64_t seed, int head_begin, int heads_total, cudaStream_t stream) {
    if (B * T == 0) return;
    const Geometry g = geometry<E>(B, T, C, NH, drop_prob, seed, head_begin, heads_total);
    const std::size_t rows = static_cast<std::size_t>(B) * NH * T;
    row_dot_kernel<<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream>>>(row_dot, dout, out,
                                                                              g);
    TRIDENT_CUDA_CHECK_LAUNCH();
    switch (split_of(g.hs)) {
        case 1:
            backward_kv_kernel<1>
                <<<blocks(g, kKeyRows), kKeyRows, 0, stream>>>(dqkv, dout, qkv, lse, row_dot, g);
            backward_q_kernel<1><<<blocks(g, kQueryRows), kQueryRows, 0, stream>>>(dqkv, dout, qkv,
                                                                                   lse, row_dot, g);
            break;
        case 2:
            backward_kv_kernel<2><<<blocks(g, kKeyRows), kKeyRows * 2, 0, stream>>>(
                dqkv, dout, qkv, lse, row_dot, g);
            backward_q_kernel<2><<<blocks(g, kQueryRows), kQueryRows * 2, 0, stream>>>(
                dqkv, dout, qkv, lse, row_dot, g);
            break;
        default:
            backward_kv_kernel<4><<<blocks(g, kKeyRows), kKeyRows * 4, 0, stream>>>(
                dqkv, dout, qkv, lse, row_dot, g);
            backward_q_kernel<4><<<blocks(g, kQueryRows), kQueryRows * 4, 0, stream>>>(
                dqkv, dout, qkv, lse, row_dot, g);
    }
    TRIDENT_CUDA_CHECK_LAUNCH();
}

#define TRIDENT_INSTANTIATE(E)                                                                   \
    template void flash_attention_forward<E>(E*, float*, const E*, int, int, int, int, float,    \
                                             uint64_t, int, int, cudaStream_t);                  \
    template void flash_attention_backward<E>(E*, float*, const E*, const E*, const E*,          \
                                              const float*, int, int, int, int, float, uint64_t, \
                                              int, int, cudaStream_t);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(__nv_bfloat16)
TRIDENT_INSTANTIATE(__half)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::kernels::cuda
