// The tiled attention kernels, written once for the flash kernels (attention_flash.cu: causal
// attention over the whole sequence) and ring attention's blocks (attention_block.cu: a block
// of queries against a block of keys at given positions). Each file gives a geometry, G below,
// that says where rows are, which keys a query sees and how results are written; the
// arithmetic here is the same for both.
//
// Forward, per (batch, head, block of 64 query rows): keys and values stream through shared
// memory 32 rows at a time, only as far as the block's last row sees; each query row keeps a
// running max m, a running sum l of exp(score - m) and an unnormalised output, rescaled when m
// grows (the online softmax); G writes out = o / l and lse = m + log l. Backward recomputes
// p = exp(score - lse) tile by tile. With D_i = dout_i . out_i and z the dropout factor:
//   dv_j += p z dout_i,   ds = p (z dout_i . v_j - D_i),   dk_j += scale ds q_i,
//   dq_i += scale ds k_j.
// dq by one kernel over blocks of queries, dk and dv by another over blocks of keys: each
// output element is summed by one thread in a fixed order, no atomics, so runs repeat bit for
// bit.
//
// Threads and registers: Split = ceil(hs / 32) threads share a row, thread s holding dims s,
// s + Split, s + 2 Split, ... (kDimsPerThread = 32 each, so heads of up to 128 take Split 4),
// so a row's dot product is 32 fused multiply-adds and log2(Split) shuffles, and the Split
// threads of a row read adjacent shared-memory words (no bank conflicts). Register arrays are
// indexed by unrolled loops only, so they stay in registers. All arithmetic is fp32; element
// types are converted where rows are loaded and results stored (a type known at run time), so
// one instantiation per Split serves fp32, bf16 and fp16.
//
// What a geometry G gives (device functions; rows i of queries and j of keys count from 0):
//   batches(), heads(), query_rows(), key_rows(), hs, scale
//   queries(qkv, b, h), keys(kv, b, h, part) (part 0: k, 1: v), outputs(out, b, h): Rows
//   stat(b, h, i): query row i's entry in lse and the row dots
//   visible(b, i, j): whether query i of batch b sees key j
//   keys_seen(end): the keys that queries below `end` may see are 0 .. keys_seen(end) - 1
//   first_key(b, i0): no query from row i0 (a real row) on sees a key before it
//   first_query(j0): no query before it sees key j0
//   sees_none_from(b, i0, j_last): no query from row i0 on sees a key up to j_last
//   mask_row(b, h, i) + j: the dropout index of (i, j); dropout_factor(index)
//   write<Split>(out, lse, b, h, i, s, o, m, l): a forward row's results
//   add_dq<Split>(dq, b, h, i, s, dq), add_dkv<Split>(dkv, b, h, j, s, dk, dv): gradients
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/elements.cuh"
#include "kernels/dtype.h"

namespace trident::kernels::cuda {

inline constexpr int kQueryRows = 64;  // query rows per block (forward, dq)
inline constexpr int kKeyRows = 64;    // key rows per block (dk, dv)
inline constexpr int kTile = 32;       // rows per shared-memory tile
inline constexpr int kDimsPerThread = 32;

// Calls f(std::integral_constant<int, Split>{}) with the Split of heads of hs elements (at
// most kFlashMaxHeadSize, attention.h).
template <typename F>
void with_split(int hs, F&& f) {
    if (hs <= 32)
        f(std::integral_constant<int, 1>{});
    else if (hs <= 64)
        f(std::integral_constant<int, 2>{});
    else
        f(std::integral_constant<int, 4>{});
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

// A thread's dims of one row of m: dim d * Split + s into x[d].
template <int Split>
__device__ void load_row(float (&x)[kDimsPerThread], const Rows& m, int row, int s) {
#pragma unroll
    for (int d = 0; d < kDimsPerThread; ++d) x[d] = m.at(row, d * Split + s);
}

// The forward: G writes each query row's output (unless !values: the statistics alone, and
// the values are not read) and log-sum-exp. Grid (query_rows / 64, heads, batches).
template <int Split, typename G>
__global__ void __launch_bounds__(kQueryRows* Split)
    attention_forward_kernel(void* out, float* lse, const void* qkv, const void* kv, G g,
                             bool values) {
    constexpr int D = kDimsPerThread * Split;
    __shared__ float keys[kTile * D], vals[kTile * D];
    const int b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * kQueryRows;
    const int s = threadIdx.x % Split, i = i0 + threadIdx.x / Split;
    float q[kDimsPerThread], o[kDimsPerThread] = {};
    load_row<Split>(q, g.queries(qkv, b, h), i, s);
    const uint64_t mask_row = g.mask_row(b, h, i);
    float m = -INFINITY, l = 0.0f;
    const int key_end = g.keys_seen(i0 + kQueryRows);
    for (int j0 = g.first_key(b, i0) / kTile * kTile; j0 < key_end; j0 += kTile) {
        __syncthreads();  // the previous tiles are used up
        load_tile<D>(keys, g.keys(kv, b, h, 0), j0);
        if (values) load_tile<D>(vals, g.keys(kv, b, h, 1), j0);
        __syncthreads();
        float score[kTile];
        float tile_max = -INFINITY;
#pragma unroll
        for (int j = 0; j < kTile; ++j) {
            float dot = 0.0f;
#pragma unroll
            for (int d = 0; d < kDimsPerThread; ++d) dot += q[d] * keys[j * D + d * Split + s];
            dot = group_sum<Split>(dot) * g.scale;
            score[j] = g.visible(b, i, j0 + j) ? dot : -INFINITY;
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
            if (values) {
                const float weight = p * g.dropout_factor(mask_row + j0 + j);
#pragma unroll
                for (int d = 0; d < kDimsPerThread; ++d)
                    o[d] += weight * vals[j * D + d * Split + s];
            }
        }
        m = m_new;
    }
    g.template write<Split>(values ? out : nullptr, lse, b, h, i, s, o, m, l);
}

// row_dot = dout . out per query row and head: one warp per row.
template <typename G>
__global__ void attention_row_dot_kernel(float* row_dot, const void* dout, const void* out, G g) {
    const std::size_t row =
        static_cast<std::size_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32, rows = g.query_rows();
    if (row >= static_cast<std::size_t>(g.batches()) * g.heads() * rows) return;
    const int i = static_cast<int>(row % rows);
    const int h = static_cast<int>(row / rows % g.heads());
    const int b = static_cast<int>(row / rows / g.heads());
    const Rows grads = g.outputs(dout, b, h), outputs = g.outputs(out, b, h);
    float sum = 0.0f;
    for (int d = lane; d < g.hs; d += 32) sum += grads.at(i, d) * outputs.at(i, d);
    sum = warp_sum(sum);
    if (lane == 0) row_dot[g.stat(b, h, i)] = sum;
}

// dq of a block of 64 queries: the key tiles they see stream through shared memory.
// Grid (query_rows / 64, heads, batches).
template <int Split, typename G>
__global__ void __launch_bounds__(kQueryRows* Split)
    attention_dq_kernel(void* dq, const float* row_dot, const void* dout, const void* qkv,
                        const void* kv, const float* lse, G g) {
    constexpr int D = kDimsPerThread * Split;
    __shared__ float keys[kTile * D], vals[kTile * D];
    const int b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * kQueryRows;
    const int s = threadIdx.x % Split, i = i0 + threadIdx.x / Split;
    const bool real = i < g.query_rows();
    float q[kDimsPerThread], grad[kDimsPerThread], dq_row[kDimsPerThread] = {};
    load_row<Split>(q, g.queries(qkv, b, h), i, s);
    load_row<Split>(grad, g.outputs(dout, b, h), i, s);
    const float row_lse = real ? lse[g.stat(b, h, i)] : 0.0f;
    const float dot_i = real ? row_dot[g.stat(b, h, i)] : 0.0f;
    const uint64_t mask_row = g.mask_row(b, h, i);
    const int key_end = g.keys_seen(i0 + kQueryRows);
    for (int j0 = g.first_key(b, i0) / kTile * kTile; j0 < key_end; j0 += kTile) {
        __syncthreads();
        load_tile<D>(keys, g.keys(kv, b, h, 0), j0);
        load_tile<D>(vals, g.keys(kv, b, h, 1), j0);
        __syncthreads();
        for (int j = 0; j < kTile; ++j) {
            float qk = 0.0f, gv = 0.0f;
#pragma unroll
            for (int d = 0; d < kDimsPerThread; ++d) {
                qk += q[d] * keys[j * D + d * Split + s];
                gv += grad[d] * vals[j * D + d * Split + s];
            }
            qk = group_sum<Split>(qk);
            gv = group_sum<Split>(gv);
            if (!g.visible(b, i, j0 + j)) continue;
            const float p = expf(qk * g.scale - row_lse);
            const float ds = p * (gv * g.dropout_factor(mask_row + j0 + j) - dot_i);
#pragma unroll
            for (int d = 0; d < kDimsPerThread; ++d)
                dq_row[d] += g.scale * ds * keys[j * D + d * Split + s];
        }
    }
    if (real) g.template add_dq<Split>(dq, b, h, i, s, dq_row);
}

// dk, dv of a block of 64 keys: the query tiles from the first that sees one of them stream
// through shared memory. Grid (key_rows / 64, heads, batches).
template <int Split, typename G>
__global__ void __launch_bounds__(kKeyRows* Split)
    attention_dkv_kernel(void* dkv, const float* row_dot, const void* dout, const void* qkv,
                         const void* kv, const float* lse, G g) {
    constexpr int D = kDimsPerThread * Split;
    __shared__ float queries[kTile * D], grads[kTile * D], tile_lse[kTile], tile_dot[kTile];
    const int b = blockIdx.z, h = blockIdx.y, j0 = blockIdx.x * kKeyRows;
    const int s = threadIdx.x % Split, j = j0 + threadIdx.x / Split;
    float key[kDimsPerThread], value[kDimsPerThread];
    float dk[kDimsPerThread] = {}, dv[kDimsPerThread] = {};
    load_row<Split>(key, g.keys(kv, b, h, 0), j, s);
    load_row<Split>(value, g.keys(kv, b, h, 1), j, s);
    for (int i0 = g.first_query(j0) / kTile * kTile; i0 < g.query_rows(); i0 += kTile) {
        if (g.sees_none_from(b, i0, j0 + kKeyRows - 1)) break;
        __syncthreads();
        load_tile<D>(queries, g.queries(qkv, b, h), i0);
        load_tile<D>(grads, g.outputs(dout, b, h), i0);
        for (int r = threadIdx.x; r < kTile; r += blockDim.x) {
            const bool real = i0 + r < g.query_rows();
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
            if (!g.visible(b, i, j)) continue;
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
    if (j < g.key_rows()) g.template add_dkv<Split>(dkv, b, h, j, s, dk, dv);
}

}  // namespace trident::kernels::cuda
