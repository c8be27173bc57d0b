// Ring attention's pieces on the GPU (kernels/ops.h, "ring attention"): a block of query rows
// against a block of key rows with each row's log-sum-exp, the merge of two blocks' results,
// and a block's backward from the whole attention's output and log-sum-exp.
//
// The block's forward and backward are attention_kernels.cuh's, as the flash kernels', on this
// geometry: query row i is row q_begin + i of qkv (B, q_rows, 3·channels) at sequence position
// q_position + i; key row j is row k_begin + j of kv (B, kv_rows, 2·channels) (k, then v) at
// k_position + j; key j is visible to query i when k_position + j <= q_position + i and,
// within documents (q_starts given), k_position + j >= the position where row i's document
// starts. A row that sees no key of the block gets lse -inf and out 0. Inputs are read widened to
// float; everything written is fp32: out (B, q_rows, channels), lse (B, NH, q_rows), and the
// gradients added into dq (B, q_rows, channels) and dkv (B, kv_rows, 2·channels).
#include <cmath>
#include <string>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/dropout.cuh"
#include "kernels/cuda/elements.cuh"
#include "kernels/error.h"
#include "kernels/ops.h"

namespace trident::kernels::cuda {

namespace {

// The block's numbers as the kernels use them; rows i and j count from the block's first.
struct Geometry {
    AttentionBlock k;
    int hs;
    float scale;
    DType type;

    __device__ int batches() const { return k.B; }
    __device__ int heads() const { return k.NH; }
    __device__ int query_rows() const { return k.q_count; }
    __device__ int key_rows() const { return k.k_count; }
    // Element offsets of row 0 of head h of batch b: q in qkv (B, q_rows, 3·channels), k in kv
    // (B, kv_rows, 2·channels) (v is channels further), out, dout and dq in (B, q_rows, channels).
    __device__ std::size_t q_base(int b, int h) const {
        return (static_cast<std::size_t>(b) * k.q_rows + k.q_begin) * 3 * k.channels +
               static_cast<std::size_t>(h) * hs;
    }
    __device__ std::size_t k_base(int b, int h) const {
        return (static_cast<std::size_t>(b) * k.kv_rows + k.k_begin) * 2 * k.channels +
               static_cast<std::size_t>(h) * hs;
    }
    __device__ std::size_t out_base(int b, int h) const {
        return (static_cast<std::size_t>(b) * k.q_rows + k.q_begin) * k.channels +
               static_cast<std::size_t>(h) * hs;
    }
    __device__ Rows queries(const void* qkv, int b, int h) const {
        return Rows{qkv,       type, q_base(b, h), 3 * static_cast<std::size_t>(k.channels),
                    k.q_count, hs};
    }
    __device__ Rows keys(const void* kv, int b, int h, int part) const {
        return Rows{kv,
                    type,
                    k_base(b, h) + static_cast<std::size_t>(part) * k.channels,
                    2 * static_cast<std::size_t>(k.channels),
                    k.k_count,
                    hs};
    }
    __device__ Rows outputs(const void* out, int b, int h) const {
        return Rows{out, type, out_base(b, h), static_cast<std::size_t>(k.channels), k.q_count, hs};
    }
    // Row i's entry in lse and the row dots (B, NH, q_rows).
    __device__ std::size_t stat(int b, int h, int i) const {
        return (static_cast<std::size_t>(b) * k.NH + h) * k.q_rows + k.q_begin + i;
    }
    // The sequence position where query row i's document starts (0 without documents).
    __device__ int start(int b, int i) const {
        return k.q_starts ? k.q_starts[static_cast<std::size_t>(b) * k.q_rows + k.q_begin + i] : 0;
    }
    __device__ bool visible(int b, int i, int j) const {
        return i < k.q_count && j < k.k_count && k.k_position + j <= k.q_position + i &&
               k.k_position + j >= start(b, i);
    }
    __device__ int keys_seen(int end) const {
        return max(0, min(k.q_position + min(end, k.q_count) - k.k_position, k.k_count));
    }
    __device__ int first_query(int j0) const { return max(0, k.k_position + j0 - k.q_position); }
    // The block's query rows are consecutive positions, so their starts never decrease.
    __device__ int first_key(int b, int i0) const { return max(0, start(b, i0) - k.k_position); }
    __device__ bool sees_none_from(int b, int i0, int j_last) const {
        return i0 < k.q_count && start(b, i0) > k.k_position + j_last;
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

    template <int Split>
    __device__ void write(void* out, float* lse, int b, int h, int i, int s,
                          const float (&o)[kDimsPerThread], float m, float l) const {
        if (i >= k.q_count) return;
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        float* row =
            static_cast<float*>(out) + out_base(b, h) + static_cast<std::size_t>(i) * k.channels;
#pragma unroll
        for (int d = 0; d < kDimsPerThread; ++d)
            if (d * Split + s < hs) row[d * Split + s] = o[d] * inv;
        if (s == 0) lse[stat(b, h, i)] = l > 0.0f ? m + logf(l) : -INFINITY;
    }
    template <int Split>
    __device__ void add_dq(void* dq, int b, int h, int i, int s,
                           const float (&x)[kDimsPerThread]) const {
        float* row =
            static_cast<float*>(dq) + out_base(b, h) + static_cast<std::size_t>(i) * k.channels;
#pragma unroll
        for (int d = 0; d < kDimsPerThread; ++d)
            if (d * Split + s < hs) row[d * Split + s] += x[d];
    }
    template <int Split>
    __device__ void add_dkv(void* dkv, int b, int h, int j, int s,
                            const float (&dk)[kDimsPerThread],
                            const float (&dv)[kDimsPerThread]) const {
        float* row =
            static_cast<float*>(dkv) + k_base(b, h) + static_cast<std::size_t>(j) * 2 * k.channels;
#pragma unroll
        for (int d = 0; d < kDimsPerThread; ++d) {
            if (d * Split + s >= hs) continue;
            row[d * Split + s] += dk[d];
            row[k.channels + d * Split + s] += dv[d];
        }
    }
};

// One thread per (b, h, row of the range).
__global__ void merge_kernel(float* out, float* lse, const float* block_out, const float* block_lse,
                             int B, int rows, int channels, int NH, int row_begin, int row_count) {
    const std::size_t n = static_cast<std::size_t>(B) * NH * row_count;
    const std::size_t t = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= n) return;
    const int r = row_begin + static_cast<int>(t % row_count);
    const int h = static_cast<int>(t / row_count % NH);
    const int b = static_cast<int>(t / row_count / NH);
    const int hs = channels / NH;
    const std::size_t stat = (static_cast<std::size_t>(b) * NH + h) * rows + r;
    const std::size_t at =
        (static_cast<std::size_t>(b) * rows + r) * channels + static_cast<std::size_t>(h) * hs;
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

template <typename E>
Geometry geometry(const AttentionBlock& k) {
    const int hs = k.channels / k.NH;
    if (!flash_attention_supports(hs))
        throw Error("ring attention's GPU kernels take head sizes 1 to " +
                    std::to_string(kFlashMaxHeadSize) + ", not " + std::to_string(hs));
    return Geometry{k, hs, 1.0f / std::sqrt(static_cast<float>(hs)), dtype_of<E>()};
}

dim3 grid_of(int rows, int rows_per_block, const AttentionBlock& k) {
    return dim3(static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block),
                static_cast<unsigned>(k.NH), static_cast<unsigned>(k.B));
}

}  // namespace

template <typename E>
void attention_block_forward(float* out, float* lse, const E* qkv, const E* kv,
                             const AttentionBlock& block, cudaStream_t stream) {
    if (block.B * block.q_count == 0) return;
    const Geometry g = geometry<E>(block);
    with_split(g.hs, [&](auto split) {
        constexpr int Split = decltype(split)::value;
        attention_forward_kernel<Split>
            <<<grid_of(block.q_count, kQueryRows, block), kQueryRows * Split, 0, stream>>>(
                out, lse, qkv, kv, g, true);
    });
    TRIDENT_CUDA_CHECK_LAUNCH();
}

void attention_merge(float* out, float* lse, const float* block_out, const float* block_lse, int B,
                     int rows, int channels, int NH, int row_begin, int row_count,
                     cudaStream_t stream) {
    const std::size_t n = static_cast<std::size_t>(B) * NH * row_count;
    if (n == 0) return;
    merge_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(out, lse, block_out, block_lse, B, rows,
                                                         channels, NH, row_begin, row_count);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

template <typename E>
void attention_block_backward(float* dq, float* dkv, float* row_dot, const E* dout, const E* qkv,
                              const E* kv, const E* out, const float* lse,
                              const AttentionBlock& block, cudaStream_t stream) {
    if (block.B * block.q_count * block.k_count == 0) return;
    const Geometry g = geometry<E>(block);
    const std::size_t rows = static_cast<std::size_t>(block.B) * block.NH * block.q_count;
    attention_row_dot_kernel<<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream>>>(
        row_dot, dout, out, g);
    TRIDENT_CUDA_CHECK_LAUNCH();
    with_split(g.hs, [&](auto split) {
        constexpr int Split = decltype(split)::value;
        attention_dq_kernel<Split>
            <<<grid_of(block.q_count, kQueryRows, block), kQueryRows * Split, 0, stream>>>(
                dq, row_dot, dout, qkv, kv, lse, g);
        attention_dkv_kernel<Split>
            <<<grid_of(block.k_count, kKeyRows, block), kKeyRows * Split, 0, stream>>>(
                dkv, row_dot, dout, qkv, kv, lse, g);
    });
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
