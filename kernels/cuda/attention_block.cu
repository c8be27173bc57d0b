// Ring attention's pieces on the GPU (kernels/ops.h, "ring attention"): a block of query rows
// against a block of key rows with each row's log-sum-exp, the merge of two blocks' results,
// and a block's backward from the whole attention's output and log-sum-exp.
//
// Tiled as the flash kernels are (attention_flash.cu, attention_tiles.cuh): per (batch, head,
// 64 query rows), Split threads a row holding 32 of its dims in registers, the block's keys and
// values streaming through shared memory 32 rows at a time, only as far as the block's last
// row sees. Forward is the online softmax over the visible keys (a running max m, sum l and
// unnormalised output, rescaled when m grows), ending with out = o / l and lse = m + log l
// (-inf and 0 for a row that sees no key of the block). Backward recomputes p = exp(score -
// lse) with the whole softmax's lse; with D_i = dout_i . out_i and z the dropout factor:
//   dv_j += p z dout_i,   ds = p (z dout_i . v_j - D_i),   dk_j += scale ds q_i,
//   dq_i += scale ds k_j.
// dq by one kernel over blocks of queries, dk and dv by another over blocks of keys: each
// output element is summed by one thread in a fixed order, no atomics, so runs repeat bit for
// bit. Key j is visible to query i when k_position + j <= q_position + i. Inputs are read
// widened to float; everything written is fp32.
#include <cmath>
#include <string>

#include "error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_tiles.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/dropout.cuh"
#include "kernels/cuda/elements.cuh"
#include "kernels/ops.h"

namespace trident::kernels::cuda {

namespace {

constexpr int kQueryRows = 64;  // query rows per block (forward, dq)
constexpr int kKeyRows = 64;    // key rows per block (dk, dv)

// The block's numbers as the kernels use them; rows i and j count from the block's first.
struct Geometry {
    AttentionBlock k;
    int hs;
    float scale;
    DType type;

    // Element offsets of row 0 of head h of batch b: q in qkv (B, q_rows, 3C), k in kv
    // (B, kv_rows, 2C) (v is C further), out, dout and dq in (B, q_rows, C).
    __device__ std::size_t q_base(int b, int h) const {
        return (static_cast<std::size_t>(b) * k.q_rows + k.q_begin) * 3 * k.C +
               static_cast<std::size_t>(h) * hs;
    }
    __device__ std::size_t k_base(int b, int h) const {
        return (static_cast<std::size_t>(b) * k.kv_rows + k.k_begin) * 2 * k.C +
               static_cast<std::size_t>(h) * hs;
    }
    __device__ std::size_t out_base(int b, int h) const {
        return (static_cast<std::size_t>(b) * k.q_rows + k.q_begin) * k.C +
               static_cast<std::size_t>(h) * hs;
    }
    // Row i's entry in lse and the row dots (B, NH, q_rows).
    __device__ std::size_t stat(int b, int h, int i) const {
        return (static_cast<std::size_t>(b) * k.NH + h) * k.q_rows + k.q_begin + i;
    }
    __device__ Rows queries(const void* qkv, int b, int h) const {
        return Rows{qkv, type, q_base(b, h), 3 * static_cast<std::size_t>(k.C), k.q_count, hs};
    }
    // The keys (values: `part` 1) of the block.
    __device__ Rows keys(const void* kv, int b, int h, int part) const {
        return Rows{kv,
                    type,
                    k_base(b, h) + static_cast<std::size_t>(part) * k.C,
                    2 * static_cast<std::size_t>(k.C),
                    k.k_count,
                    hs};
    }
    __device__ Rows outputs(const void* out, int b, int h) const {
        return Rows{out, type, out_base(b, h), static_cast<std::size_t>(k.C), k.q_count, hs};
    }
    __device__ bool visible(int i, int j) const {
        return i < k.q_count && j < k.k_count && k.k_position + j <= k.q_position + i;
    }
    // The keys that query rows below `rows_end` may see: 0 .. the result - 1.
    __device__ int keys_seen(int rows_end) const {
        const int end = k.q_position + min(rows_end, k.q_count) - k.k_position;
        return max(0, min(end, k.k_count));
    }
    // Dropout index of (b, h, query i, key 0) in the whole sequence's (B, heads_total, T, T).
    __device__ uint64_t mask_row(int b, int h, int i) const {
        const uint64_t T = static_cast<uint64_t>(k.seq_len);
        return ((static_cast<uint64_t>(b) * k.heads_total + k.head_begin + h) * T + k.q_position +
                i) *
                   T +
               k.k_position;
    }
    __device__ float dropout_factor(uint64_t index) const {
        if (k.drop_prob == 0.0f) return 1.0f;
        return dropout_kept(k.seed, index, k.drop_prob) ? 1.0f / (1.0f - k.drop_prob) : 0.0f;
    }
};

// out (B, q_rows, C) and lse (B, NH, q_rows) on the block's rows. Grid (q_count / 64, NH, B).
template <int Split>
__global__ void __launch_bounds__(kQueryRows* Split)
    block_forward_kernel(float* out, float* lse, const void* qkv, const void* kv, Geometry g) {
    constexpr int D = kDimsPerThread * Split;
    __shared__ float keys[kTile * D], values[kTile * D];
    const int b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * kQueryRows;
    const int s = threadIdx.x % Split, i = i0 + threadIdx.x / Split;
    float q[kDimsPerThread], o[kDimsPerThread] = {};
    load_row<Split>(q, g.queries(qkv, b, h), i, s);
    const uint64_t mask_row = g.mask_row(b, h, i);
    float m = -INFINITY, l = 0.0f;
    const int key_end = g.keys_seen(i0 + kQueryRows);
    for (int j0 = 0; j0 < key_end; j0 += kTile) {
        __syncthreads();  // the previous tiles are used up
        load_tile<D>(keys, g.keys(kv, b, h, 0), j0);
        load_tile<D>(values, g.keys(kv, b, h, 1), j0);
        __syncthreads();
        float score[kTile];
        float tile_max = -INFINITY;
#pragma unroll
        for (int j = 0; j < kTile; ++j) {
            float dot = 0.0f;
#pragma unroll
            for (int d = 0; d < kDimsPerThread; ++d) dot += q[d] * keys[j * D + d * Split + s];
            dot = group_sum<Split>(dot) * g.scale;
            score[j] = g.visible(i, j0 + j) ? dot : -INFINITY;
            tile_max = fmaxf(tile_max, score[j]);
        }
        const float m_new = fmaxf(m, tile_max);
        if (m_new == -INFINITY) continue;     // no key seen yet by this row
        const float alpha = expf(m - m_new);  // 0 on the first tile seen (m = -inf)
        l *= alpha;
#pragma unroll
        for (int d = 0; d < kDimsPerThread; ++d) o[d] *= alpha;
#pragma unroll
        for (int j = 0; j < kTile; ++j) {
            const float p = expf(score[j] - m_new);  // 0 for keys not seen
            l += p;
            const float weight = p * g.dropout_factor(mask_row + j0 + j);
#pragma unroll
            for (int d = 0; d < kDimsPerThread; ++d) o[d] += weight * values[j * D + d * Split + s];
        }
        m = m_new;
    }
    if (i >= g.k.q_count) return;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    float* out_row = out + g.out_base(b, h) + static_cast<std::size_t>(i) * g.k.C;
#pragma unroll
    for (int d = 0; d < kDimsPerThread; ++d)
        if (d * Split + s < g.hs) out_row[d * Split + s] = o[d] * inv;
    if (s == 0) lse[g.stat(b, h, i)] = l > 0.0f ? m + logf(l) : -INFINITY;
}

// One thread per (b, h, row of the range).
__global__ void merge_kernel(float* out, float* lse, const float* block_out, const float* block_lse,
                             int B, int rows, int C, int NH, int row_begin, int row_count) {
    const std::size_t n = static_cast<std::size_t>(B) * NH * row_count;
    const std::size_t t = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= n) return;
    const int r = row_begin + static_cast<int>(t % row_count);
    const int h = static_cast<int>(t / row_count % NH);
    const int b = static_cast<int>(t / row_count / NH);
    const int hs = C / NH;
    const std::size_t stat = (static_cast<std::size_t>(b) * NH + h) * rows + r;
    const std::size_t at =
        (static_cast<std::size_t>(b) * rows + r) * C + static_cast<std::size_t>(h) * hs;
    const float a = lse[stat], c = block_lse[stat];
    if (c == -INFINITY) return;  // the block saw nothing here
    if (a == -INFINITY) {        // nothing seen before it
        lse[stat] = c;
        for (int d = 0; d < hs; ++d) out[at + d] = block_out[at + d];
        return;
    }
    const float merged = a > c ? a + log1pf(expf(c - a)) : c + log1pf(expf(a - c));
    const float wa = expf(a - merged), wc = expf(c - merged);
    for (int d = 0; d < hs; ++d) out[at + d] = out[at + d] * wa + block_out[at + d] * wc;
    lse[stat] = merged;
}

// row_dot (B, NH, q_rows) on the block's rows = dout . out per head: one warp per row.
__global__ void row_dot_kernel(float* row_dot, const void* dout, const void* out, Geometry g) {
    const std::size_t row =
        static_cast<std::size_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= static_cast<std::size_t>(g.k.B) * g.k.NH * g.k.q_count) return;
    const int i = static_cast<int>(row % g.k.q_count);
    const int h = static_cast<int>(row / g.k.q_count % g.k.NH);
    const int b = static_cast<int>(row / g.k.q_count / g.k.NH);
    const Rows grads = g.outputs(dout, b, h), outputs = g.outputs(out, b, h);
    float sum = 0.0f;
    for (int d = lane; d < g.hs; d += 32) sum += grads.at(i, d) * outputs.at(i, d);
    sum = warp_sum(sum);
    if (lane == 0) row_dot[g.stat(b, h, i)] = sum;
}

// dq of a block of 64 queries: the key tiles they see stream through shared memory.
// Grid (q_count / 64, NH, B).
template <int Split>
__global__ void __launch_bounds__(kQueryRows* Split)
    block_backward_q_kernel(float* dq, const float* row_dot, const void* dout, const void* qkv,
                            const void* kv, const float* lse, Geometry g) {
    constexpr int D = kDimsPerThread * Split;
    __shared__ float keys[kTile * D], values[kTile * D];
    const int b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * kQueryRows;
    const int s = threadIdx.x % Split, i = i0 + threadIdx.x / Split;
    const bool real = i < g.k.q_count;
    float q[kDimsPerThread], grad[kDimsPerThread], dq_row[kDimsPerThread] = {};
    load_row<Split>(q, g.queries(qkv, b, h), i, s);
    load_row<Split>(grad, g.outputs(dout, b, h), i, s);
    const float row_lse = real ? lse[g.stat(b, h, i)] : 0.0f;
    const float dot_i = real ? row_dot[g.stat(b, h, i)] : 0.0f;
    const uint64_t mask_row = g.mask_row(b, h, i);
    const int key_end = g.keys_seen(i0 + kQueryRows);
    for (int j0 = 0; j0 < key_end; j0 += kTile) {
        __syncthreads();
        load_tile<D>(keys, g.keys(kv, b, h, 0), j0);
        load_tile<D>(values, g.keys(kv, b, h, 1), j0);
        __syncthreads();
        for (int j = 0; j < kTile; ++j) {
            float qk = 0.0f, gv = 0.0f;
#pragma unroll
            for (int d = 0; d < kDimsPerThread; ++d) {
                qk += q[d] * keys[j * D + d * Split + s];
                gv += grad[d] * values[j * D + d * Split + s];
            }
            qk = group_sum<Split>(qk);
            gv = group_sum<Split>(gv);
            if (!g.visible(i, j0 + j)) continue;
            const float p = expf(qk * g.scale - row_lse);
            const float ds = p * (gv * g.dropout_factor(mask_row + j0 + j) - dot_i);
#pragma unroll
            for (int d = 0; d < kDimsPerThread; ++d)
                dq_row[d] += g.scale * ds * keys[j * D + d * Split + s];
        }
    }
    if (!real) return;
    float* target = dq + g.out_base(b, h) + static_cast<std::size_t>(i) * g.k.C;
#pragma unroll
    for (int d = 0; d < kDimsPerThread; ++d)
        if (d * Split + s < g.hs) target[d * Split + s] += dq_row[d];
}

// dk, dv of a block of 64 keys: the query tiles from the first that sees one of them stream
// through shared memory. Grid (k_count / 64, NH, B).
template <int Split>
__global__ void __launch_bounds__(kKeyRows* Split)
    block_backward_kv_kernel(float* dkv, const float* row_dot, const void* dout, const void* qkv,
                             const void* kv, const float* lse, Geometry g) {
    constexpr int D = kDimsPerThread * Split;
    __shared__ float queries[kTile * D], grads[kTile * D], tile_lse[kTile], tile_dot[kTile];
    const int b = blockIdx.z, h = blockIdx.y, j0 = blockIdx.x * kKeyRows;
    const int s = threadIdx.x % Split, j = j0 + threadIdx.x / Split;
    float key[kDimsPerThread], value[kDimsPerThread];
    float dk[kDimsPerThread] = {}, dv[kDimsPerThread] = {};
    load_row<Split>(key, g.keys(kv, b, h, 0), j, s);
    load_row<Split>(value, g.keys(kv, b, h, 1), j, s);
    // The first query that sees key j0: k_position + j0 <= q_position + i.
    const int first = max(0, g.k.k_position + j0 - g.k.q_position);
    for (int i0 = first / kTile * kTile; i0 < g.k.q_count; i0 += kTile) {
        __syncthreads();
        load_tile<D>(queries, g.queries(qkv, b, h), i0);
        load_tile<D>(grads, g.outputs(dout, b, h), i0);
        for (int r = threadIdx.x; r < kTile; r += blockDim.x) {
            const bool real = i0 + r < g.k.q_count;
            tile_lse[r] = real ? lse[g.stat(b, h, i0 + r)] : 0.0f;
            tile_dot[r] = real ? row_dot[g.stat(b, h, i0 + r)] : 0.0f;
        }
        __syncthreads();
        for (int r = 0; r < kTile; ++r) {
            float qk = 0.0f, gv = 0.0f;
#pragma unroll
            for (int d = 0; d < kDimsPerThread; ++d) {
                qk += queries[r * D + d * Split + s] * key[d];
                gv += grads[r * D + d * Split + s] * value[d];
            }
            qk = group_sum<Split>(qk);
            gv = group_sum<Split>(gv);
            const int i = i0 + r;
            if (!g.visible(i, j)) continue;
            const float p = expf(qk * g.scale - tile_lse[r]);
            const float z = g.dropout_factor(g.mask_row(b, h, i) + j);
            const float ds = p * (gv * z - tile_dot[r]);
#pragma unroll
            for (int d = 0; d < kDimsPerThread; ++d) {
                dv[d] += p * z * grads[r * D + d * Split + s];
                dk[d] += g.scale * ds * queries[r * D + d * Split + s];
            }
        }
    }
    if (j >= g.k.k_count) return;
    float* target = dkv + g.k_base(b, h) + static_cast<std::size_t>(j) * 2 * g.k.C;
#pragma unroll
    for (int d = 0; d < kDimsPerThread; ++d) {
        if (d * Split + s >= g.hs) continue;
        target[d * Split + s] += dk[d];
        target[g.k.C + d * Split + s] += dv[d];
    }
}

template <typename E>
Geometry geometry(const AttentionBlock& k) {
    const int hs = k.C / k.NH;
    if (!flash_attention_supports(hs))
        throw Error("ring attention's GPU kernels take head sizes 1 to " +
                    std::to_string(kFlashMaxHeadSize) + ", not " + std::to_string(hs));
    return Geometry{k, hs, 1.0f / std::sqrt(static_cast<float>(hs)), dtype_of<E>()};
}

dim3 grid_of(int rows, int rows_per_block, const AttentionBlock& k) {
    return dim3(static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block),
                static_cast<unsigned>(k.NH), static_cast<unsigned>(k.B));
}

// Runs kernel<Split> for the head size, with rows_per_block * Split threads a block.
template <template <int> class Launch, typename... Args>
void by_split(int hs, Args&&... args) {
    switch (split_of(hs)) {
        case 1:
            Launch<1>::run(args...);
            break;
        case 2:
            Launch<2>::run(args...);
            break;
        default:
            Launch<4>::run(args...);
    }
}

template <int Split>
struct Forward {
    static void run(dim3 grid, cudaStream_t stream, float* out, float* lse, const void* qkv,
                    const void* kv, const Geometry& g) {
        block_forward_kernel<Split><<<grid, kQueryRows * Split, 0, stream>>>(out, lse, qkv, kv, g);
    }
};

template <int Split>
struct Backward {
    static void run(dim3 q_grid, dim3 k_grid, cudaStream_t stream, float* dq, float* dkv,
                    const float* row_dot, const void* dout, const void* qkv, const void* kv,
                    const float* lse, const Geometry& g) {
        block_backward_q_kernel<Split>
            <<<q_grid, kQueryRows * Split, 0, stream>>>(dq, row_dot, dout, qkv, kv, lse, g);
        block_backward_kv_kernel<Split>
            <<<k_grid, kKeyRows * Split, 0, stream>>>(dkv, row_dot, dout, qkv, kv, lse, g);
    }
};

}  // namespace

template <typename E>
void attention_block_forward(float* out, float* lse, const E* qkv, const E* kv,
                             const AttentionBlock& block, cudaStream_t stream) {
    if (block.B * block.q_count == 0) return;
    const Geometry g = geometry<E>(block);
    by_split<Forward>(g.hs, grid_of(block.q_count, kQueryRows, block), stream, out, lse,
                      static_cast<const void*>(qkv), static_cast<const void*>(kv), g);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

void attention_merge(float* out, float* lse, const float* block_out, const float* block_lse, int B,
                     int rows, int C, int NH, int row_begin, int row_count, cudaStream_t stream) {
    const std::size_t n = static_cast<std::size_t>(B) * NH * row_count;
    if (n == 0) return;
    merge_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(out, lse, block_out, block_lse, B, rows, C,
                                                         NH, row_begin, row_count);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

template <typename E>
void attention_block_backward(float* dq, float* dkv, float* row_dot, const E* dout, const E* qkv,
                              const E* kv, const E* out, const float* lse,
                              const AttentionBlock& block, cudaStream_t stream) {
    if (block.B * block.q_count * block.k_count == 0) return;
    const Geometry g = geometry<E>(block);
    const std::size_t rows = static_cast<std::size_t>(block.B) * block.NH * block.q_count;
    row_dot_kernel<<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream>>>(row_dot, dout, out,
                                                                              g);
    TRIDENT_CUDA_CHECK_LAUNCH();
    by_split<Backward>(g.hs, grid_of(block.q_count, kQueryRows, block),
                       grid_of(block.k_count, kKeyRows, block), stream, dq, dkv,
                       static_cast<const float*>(row_dot), static_cast<const void*>(dout),
                       static_cast<const void*>(qkv), static_cast<const void*>(kv), lse, g);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

#define TRIDENT_INSTANTIATE(E)                                                            \
    template void attention_block_forward<E>(float*, float*, const E*, const E*,          \
                                             const AttentionBlock&, cudaStream_t);        \
    template void attention_block_backward<E>(float*, float*, float*, const E*, const E*, \
                                              const E*, const E*, const float*,           \
                                              const AttentionBlock&, cudaStream_t);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(__nv_bfloat16)
TRIDENT_INSTANTIATE(__half)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::kernels::cuda
