// Ring attention's pieces on the GPU (kernels/ops.h, "ring attention"): a block of query rows
// against a block of key rows with each row's log-sum-exp, the merge of two blocks' results,
// and a block's backward from the whole attention's output and log-sum-exp.
//
// Written to be simple rather than fast: one thread per row, its q (or k and v) and running
// sums in per-thread arrays of up to kFlashMaxHeadSize floats, every product a loop over the
// head's dims, no shared memory. Forward is the online softmax over the visible keys (a
// running max m, sum l and unnormalised output, rescaled when m grows), ending with
// out = o / l and lse = m + log l. Backward recomputes p = exp(score - lse) with the whole
// softmax's lse; with D_i = dout_i . out_i and z the dropout factor:
//   dv_j += p z dout_i,   ds = p (z dout_i . v_j - D_i),   dk_j += scale ds q_i,
//   dq_i += scale ds k_j.
// dq by one kernel over query rows, dk and dv by another over key rows: each output element is
// summed by one thread in a fixed order, no atomics, so runs repeat bit for bit. Inputs are
// read widened to float; everything written is fp32.
#include <cmath>
#include <string>

#include "kernels/error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/dropout.cuh"
#include "kernels/cuda/elements.cuh"
#include "kernels/ops.h"

namespace trident::kernels::cuda {

namespace {

constexpr int kRowsPerBlock = 64;
constexpr int kMaxHead = kFlashMaxHeadSize;

// The block's numbers as the kernels use them.
struct Geometry {
    AttentionBlock k;
    int hs;
    float scale;

    // Row i of the block's queries: q (and dq's row in (B, q_rows, C)) of head h of batch b.
    __device__ std::size_t q_row(int b, int i) const {
        return static_cast<std::size_t>(b) * k.q_rows + k.q_begin + i;
    }
    __device__ std::size_t kv_row(int b, int j) const {
        return static_cast<std::size_t>(b) * k.kv_rows + k.k_begin + j;
    }
    // Row i's entry in lse and the row dots (B, NH, q_rows).
    __device__ std::size_t stat(int b, int h, int i) const {
        return (static_cast<std::size_t>(b) * k.NH + h) * k.q_rows + k.q_begin + i;
    }
    // Keys visible to query i: 0 .. count-1.
    __device__ int visible(int i) const {
        const int last = k.q_position + i - k.k_position;
        return last < 0 ? 0 : min(last + 1, k.k_count);
    }
    __device__ float dropout_factor(int b, int h, int i, int j) const {
        if (k.drop_prob == 0.0f) return 1.0f;
        const uint64_t T = static_cast<uint64_t>(k.seq_len);
        const uint64_t index =
            ((static_cast<uint64_t>(b) * k.heads_total + k.head_begin + h) * T + k.q_position + i) *
                T +
            k.k_position + j;
        return dropout_kept(k.seed, index, k.drop_prob) ? 1.0f / (1.0f - k.drop_prob) : 0.0f;
    }
};

template <typename E>
__device__ void load(float* x, const E* src, int n) {
    for (int d = 0; d < n; ++d) x[d] = to_float(src[d]);
}

template <typename E>
__device__ float dot(const float* x, const E* y, int n) {
    float sum = 0.0f;
    for (int d = 0; d < n; ++d) sum += x[d] * to_float(y[d]);
    return sum;
}

// Grid (q_count / 64, NH, B): one thread per query row.
template <typename E>
__global__ void block_forward_kernel(float* out, float* lse, const E* qkv, const E* kv,
                                     Geometry g) {
    const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x * kRowsPerBlock + threadIdx.x;
    if (i >= g.k.q_count) return;
    const int C = g.k.C, hs = g.hs;
    float q[kMaxHead], o[kMaxHead];
    load(q, qkv + g.q_row(b, i) * 3 * C + static_cast<std::size_t>(h) * hs, hs);
    for (int d = 0; d < hs; ++d) o[d] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    const int visible = g.visible(i);
    for (int j = 0; j < visible; ++j) {
        const E* key = kv + g.kv_row(b, j) * 2 * C + static_cast<std::size_t>(h) * hs;
        const float score = dot(q, key, hs) * g.scale;
        if (score > m) {
            const float alpha = expf(m - score);  // 0 on the first key (m = -inf)
            l *= alpha;
            for (int d = 0; d < hs; ++d) o[d] *= alpha;
            m = score;
        }
        const float p = expf(score - m);
        l += p;
        const float weight = p * g.dropout_factor(b, h, i, j);
        const E* value = key + C;
        for (int d = 0; d < hs; ++d) o[d] += weight * to_float(value[d]);
    }
    float* out_row = out + g.q_row(b, i) * C + static_cast<std::size_t>(h) * hs;
    const float inv = visible > 0 ? 1.0f / l : 0.0f;
    for (int d = 0; d < hs; ++d) out_row[d] = o[d] * inv;
    lse[g.stat(b, h, i)] = visible > 0 ? m + logf(l) : -INFINITY;
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

// row_dot (B, NH, q_rows) on the block's rows = dout . out per head.
template <typename E>
__global__ void row_dot_kernel(float* row_dot, const E* dout, const E* out, Geometry g) {
    const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x * kRowsPerBlock + threadIdx.x;
    if (i >= g.k.q_count) return;
    const std::size_t at = g.q_row(b, i) * g.k.C + static_cast<std::size_t>(h) * g.hs;
    float sum = 0.0f;
    for (int d = 0; d < g.hs; ++d) sum += to_float(dout[at + d]) * to_float(out[at + d]);
    row_dot[g.stat(b, h, i)] = sum;
}

// dq of one query row per thread. Grid (q_count / 64, NH, B).
template <typename E>
__global__ void block_backward_q_kernel(float* dq, const float* row_dot, const E* dout,
                                        const E* qkv, const E* kv, const float* lse, Geometry g) {
    const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x * kRowsPerBlock + threadIdx.x;
    if (i >= g.k.q_count) return;
    const int C = g.k.C, hs = g.hs;
    float q[kMaxHead], grad[kMaxHead], dq_row[kMaxHead];
    load(q, qkv + g.q_row(b, i) * 3 * C + static_cast<std::size_t>(h) * hs, hs);
    load(grad, dout + g.q_row(b, i) * C + static_cast<std::size_t>(h) * hs, hs);
    for (int d = 0; d < hs; ++d) dq_row[d] = 0.0f;
    const float row_lse = lse[g.stat(b, h, i)], dot_i = row_dot[g.stat(b, h, i)];
    const int visible = g.visible(i);
    for (int j = 0; j < visible; ++j) {
        const E* key = kv + g.kv_row(b, j) * 2 * C + static_cast<std::size_t>(h) * hs;
        const float p = expf(dot(q, key, hs) * g.scale - row_lse);
        const float ds = p * (g.dropout_factor(b, h, i, j) * dot(grad, key + C, hs) - dot_i);
        for (int d = 0; d < hs; ++d) dq_row[d] += g.scale * ds * to_float(key[d]);
    }
    float* target = dq + g.q_row(b, i) * C + static_cast<std::size_t>(h) * hs;
    for (int d = 0; d < hs; ++d) target[d] += dq_row[d];
}

// dk, dv of one key row per thread. Grid (k_count / 64, NH, B).
template <typename E>
__global__ void block_backward_kv_kernel(float* dkv, const float* row_dot, const E* dout,
                                         const E* qkv, const E* kv, const float* lse, Geometry g) {
    const int b = blockIdx.z, h = blockIdx.y, j = blockIdx.x * kRowsPerBlock + threadIdx.x;
    if (j >= g.k.k_count) return;
    const int C = g.k.C, hs = g.hs;
    float key[kMaxHead], value[kMaxHead], dk[kMaxHead], dv[kMaxHead];
    const std::size_t kv_at = g.kv_row(b, j) * 2 * C + static_cast<std::size_t>(h) * hs;
    load(key, kv + kv_at, hs);
    load(value, kv + kv_at + C, hs);
    for (int d = 0; d < hs; ++d) dk[d] = dv[d] = 0.0f;
    // Queries from the first that sees key j.
    const int first = max(0, g.k.k_position + j - g.k.q_position);
    for (int i = first; i < g.k.q_count; ++i) {
        const E* q = qkv + g.q_row(b, i) * 3 * C + static_cast<std::size_t>(h) * hs;
        const E* grad = dout + g.q_row(b, i) * C + static_cast<std::size_t>(h) * hs;
        const float p = expf(dot(key, q, hs) * g.scale - lse[g.stat(b, h, i)]);
        const float z = g.dropout_factor(b, h, i, j);
        const float ds = p * (z * dot(value, grad, hs) - row_dot[g.stat(b, h, i)]);
        for (int d = 0; d < hs; ++d) {
            dv[d] += p * z * to_float(grad[d]);
            dk[d] += g.scale * ds * to_float(q[d]);
        }
    }
    float* target = dkv + kv_at;
    for (int d = 0; d < hs; ++d) {
        target[d] += dk[d];
        target[C + d] += dv[d];
    }
}

Geometry geometry(const AttentionBlock& k) {
    const int hs = k.C / k.NH;
    if (hs < 1 || hs > kMaxHead)
        throw Error("ring attention's GPU kernels take head sizes 1 to " +
                    std::to_string(kMaxHead) + ", not " + std::to_string(hs));
    return Geometry{k, hs, 1.0f / std::sqrt(static_cast<float>(hs))};
}

dim3 grid_of(int rows, const AttentionBlock& k) {
    return dim3(static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock),
                static_cast<unsigned>(k.NH), static_cast<unsigned>(k.B));
}

}  // namespace

template <typename E>
void attention_block_forward(float* out, float* lse, const E* qkv, const E* kv,
                             const AttentionBlock& block, cudaStream_t stream) {
    if (block.B * block.q_count == 0) return;
    const Geometry g = geometry(block);
    block_forward_kernel<E>
        <<<grid_of(block.q_count, block), kRowsPerBlock, 0, stream>>>(out, lse, qkv, kv, g);
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
    const Geometry g = geometry(block);
    row_dot_kernel<E>
        <<<grid_of(block.q_count, block), kRowsPerBlock, 0, stream>>>(row_dot, dout, out, g);
    TRIDENT_CUDA_CHECK_LAUNCH();
    block_backward_q_kernel<E><<<grid_of(block.q_count, block), kRowsPerBlock, 0, stream>>>(
        dq, row_dot, dout, qkv, kv, lse, g);
    TRIDENT_CUDA_CHECK_LAUNCH();
    block_backward_kv_kernel<E><<<grid_of(block.k_count, block), kRowsPerBlock, 0, stream>>>(
        dkv, row_dot, dout, qkv, kv, lse, g);
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
