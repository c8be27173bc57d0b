// The geometry of the model's causal attention over the packed qkv, for the flash kernels: the
// fp32 kernels of attention_kernels.cuh (attention_flash.cu) and the tensor-core kernels of
// attention_mma.cu share it. Queries, keys and values are the T rows of qkv (B,T,3·channels), head
// h of row t at t*3·channels + h*hs (+channels for k, +2·channels for v); key j is visible to query
// i when j <= i and, within documents (starts given), j >= starts[b·T + i], the first row of
// query i's document; out and dout are (B,T,channels), lse and the row dots (B,NH,T). The dropout
// mask is the model's: element (b, head_begin + h, i, j) of (B, heads_total, T, T), as in
// kernels/ops.h. A sequence's document starts never decrease along its rows, so the key tiles
// before a query block's first row's start, and the query tiles past the last row whose document
// starts by a key block's last key, are skipped whole.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/dropout.cuh"
#include "kernels/cuda/elements.cuh"
#include "kernels/error.h"

namespace trident::kernels::cuda {

struct FlashGeometry {
    int B, T, channels, NH, hs, heads_total, head_begin;
    float scale, drop_prob, keep_scale;
    uint64_t seed;
    DType type;
    const int32_t* starts;  // (B·T) each row's document's first row, or null: one document

    __device__ int batches() const { return B; }
    __device__ int heads() const { return NH; }
    __device__ int query_rows() const { return T; }
    __device__ int key_rows() const { return T; }
    // Element offsets: q of head h of batch b at row 0 in qkv (B,T,3·channels); k is channels
    // further, v 2·channels.
    __device__ std::size_t q_base(int b, int h) const {
        return static_cast<std::size_t>(b) * T * 3 * channels + static_cast<std::size_t>(h) * hs;
    }
    // Head h of batch b at row 0 in out or dout (B,T,channels).
    __device__ std::size_t out_base(int b, int h) const {
        return static_cast<std::size_t>(b) * T * channels + static_cast<std::size_t>(h) * hs;
    }
    __device__ Rows queries(const void* qkv, int b, int h) const {
        return Rows{qkv, type, q_base(b, h), 3 * static_cast<std::size_t>(channels), T, hs};
    }
    __device__ Rows keys(const void* qkv, int b, int h, int part) const {
        return Rows{qkv,
                    type,
                    q_base(b, h) + static_cast<std::size_t>(1 + part) * channels,
                    3 * static_cast<std::size_t>(channels),
                    T,
                    hs};
    }
    __device__ Rows outputs(const void* out, int b, int h) const {
        return Rows{out, type, out_base(b, h), static_cast<std::size_t>(channels), T, hs};
    }
    // Row i of head h of batch b in lse and the row dots (B,NH,T).
    __device__ std::size_t stat(int b, int h, int i) const {
        return (static_cast<std::size_t>(b) * NH + h) * T + i;
    }
    // Whether key j is in query row i's document (rows past T: in every one).
    __device__ bool in_document(int b, int i, int j) const {
        return !starts || i >= T || j >= starts[static_cast<std::size_t>(b) * T + i];
    }
    __device__ bool visible(int b, int i, int j) const {
        return j <= i && i < T && in_document(b, i, j);
    }
    __device__ int keys_seen(int end) const { return min(T, end); }
    __device__ int first_query(int j0) const { return j0; }
    // The first key that queries from row i0 (< T) on may see.
    __device__ int first_key(int b, int i0) const {
        return starts ? starts[static_cast<std::size_t>(b) * T + i0] : 0;
    }
    // Whether no query from row i0 on sees a key up to j_last.
    __device__ bool sees_none_from(int b, int i0, int j_last) const {
        return starts && i0 < T && starts[static_cast<std::size_t>(b) * T + i0] > j_last;
    }
    // Dropout index of (b, h, i, 0) in the model's (B, heads_total, T, T).
    __device__ uint64_t mask_row(int b, int h, int i) const {
        return ((static_cast<uint64_t>(b) * heads_total + head_begin + h) * T + i) * T;
    }
    __device__ float dropout_factor(uint64_t index) const {
        if (drop_prob == 0.0f) return 1.0f;
        return dropout_kept(seed, index, drop_prob) ? keep_scale : 0.0f;
    }

    // dst[base + row * stride + d] += x over this thread's dims d, in qkv's type.
    template <int Split>
    __device__ void add_row(void* dst, std::size_t base, std::size_t stride, int row, int s,
                            const float (&x)[kDimsPerThread]) const {
#pragma unroll
        for (int k = 0; k < kDimsPerThread; ++k) {
            const int d = k * Split + s;
            if (d < hs) {
                const std::size_t i = base + row * stride + d;
                store_from_float(dst, type, i, load_as_float(dst, type, i) + x[k]);
            }
        }
    }
    // Every query row sees itself, so l > 0.
    template <int Split>
    __device__ void write(void* out, float* lse, int b, int h, int i, int s,
                          const float (&o)[kDimsPerThread], float m, float l) const {
        if (i >= T) return;
        if (out) {
            const float inv = 1.0f / l;
#pragma unroll
            for (int k = 0; k < kDimsPerThread; ++k) {
                const int d = k * Split + s;
                if (d < hs)
                    store_from_float(out, type,
                                     out_base(b, h) + static_cast<std::size_t>(i) * channels + d,
                                     o[k] * inv);
            }
        }
        if (s == 0) lse[stat(b, h, i)] = m + logf(l);
    }
    template <int Split>
    __device__ void add_dq(void* dqkv, int b, int h, int i, int s,
                           const float (&dq)[kDimsPerThread]) const {
        add_row<Split>(dqkv, q_base(b, h), 3 * static_cast<std::size_t>(channels), i, s, dq);
    }
    template <int Split>
    __device__ void add_dkv(void* dqkv, int b, int h, int j, int s,
                            const float (&dk)[kDimsPerThread],
                            const float (&dv)[kDimsPerThread]) const {
        const std::size_t stride = 3 * static_cast<std::size_t>(channels);
        add_row<Split>(dqkv, q_base(b, h) + channels, stride, j, s, dk);
        add_row<Split>(dqkv, q_base(b, h) + 2 * static_cast<std::size_t>(channels), stride, j, s,
                       dv);
    }
};

template <typename E>
FlashGeometry flash_geometry(int B, int T, int channels, int NH, float drop_prob, uint64_t seed,
                             int head_begin, int heads_total, const int32_t* starts) {
    const int hs = channels / NH;
    // A thread holds kDimsPerThread dims of a row and at most 4 threads share it: larger heads
    // would lose their last dims. Start-up refuses such a model (cuda_ops.h); this guards the
    // kernels themselves.
    if (!flash_attention_supports(hs))
        throw Error("the flash-attention kernels take head sizes 1 to " +
                    std::to_string(kFlashMaxHeadSize) + ", not " + std::to_string(hs));
    return FlashGeometry{B,          T,
                         channels,   NH,
                         hs,         heads_total,
                         head_begin, 1.0f / std::sqrt(static_cast<float>(hs)),
                         drop_prob,  1.0f / (1.0f - drop_prob),
                         seed,       dtype_of<E>(),
                         starts};
}

// The tensor-core kernels for 16-bit elements (attention_mma.cu), on heads of up to
// kFlashMaxHeadSize: the forward (out null: lse alone, bit for bit as with out), and the
// backward's dq, dk and dv added into dqkv given row_dot (B,NH,T) = dout . out per row.
template <typename E>
void tensor_core_attention_forward(E* out, float* lse, const E* qkv, const FlashGeometry& g,
                                   cudaStream_t stream);
template <typename E>
void tensor_core_attention_backward(E* dqkv, const float* row_dot, const E* dout, const E* qkv,
                                    const float* lse, const FlashGeometry& g, cudaStream_t stream);

}  // namespace trident::kernels::cuda
