// Rotary position embedding (Su et al. 2021) in Hugging Face Llama's rotate-half convention,
// fused with grouped-query attention's sharing of key/value heads, forward and backward
// (kernels/ops.h, rotary_qkv_forward): the grouped q, k, v of the attention's input linear
// become the q, k, v attention_forward reads, and their gradients go back.
//
// One block per token row. Its threads first put the row's hs/2 cosines and sines in shared
// memory, then go over the row's heads, a thread per pair of channels (i, i + hs/2): the
// loads of a warp are consecutive channels of one head. The angle p·θ^(−2i/hs) is computed
// in fp32 in the CPU backend's steps (kernels/cpu/rotary.cpp), its power, cosine and sine in
// double and then rounded: the fp32 values correctly rounded, which the host's powf, cosf and
// sinf (under one ulp off) nearly always are too. The GPU's own fp32 powf is up to a few ulps
// off, and at positions far into a long sequence (angles of 10^5 radians) one ulp of the
// angle moves its cosine by 10^-2: rounded the same way, the rows rotate as on the CPU.
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/elements.cuh"
#include "kernels/error.h"

namespace trident::kernels::cuda {

namespace {

constexpr int kThreads = 256;

// table (hs) = the cosines (hs/2), then the sines (hs/2), of the angles of position p.
__device__ void row_angles(float* table, int p, int hs, float theta) {
    const int half = hs / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float exponent = static_cast<float>(2 * i) / static_cast<float>(hs);
        const float power =
            static_cast<float>(pow(static_cast<double>(theta), static_cast<double>(exponent)));
        const float a = static_cast<float>(p) * (1.0f / power);
        table[i] = static_cast<float>(cos(static_cast<double>(a)));
        table[half + i] = static_cast<float>(sin(static_cast<double>(a)));
    }
    __syncthreads();
}

__device__ int position_of(const int32_t* positions, int n, int T) {
    return positions ? positions[n % T] : n % T;
}

// Where part 0 (q, channels elements), 1 (k, kv elements) or 2 (v) of a row of qkv begins.
__device__ std::size_t grouped_part(int part, std::size_t channels, std::size_t kv) {
    return part == 0 ? 0 : channels + static_cast<std::size_t>(part - 1) * kv;
}

// Row n of out (B·T, 3·NH·hs) from row n of qkv (B·T, (NH + 2·KVH)·hs): out's q, k and v parts
// each hold NH heads; q head h rotated, k and v head h from key/value head h / (NH/KVH), k
// rotated, v copied.
template <typename E>
__global__ void __launch_bounds__(kThreads)
    rotary_qkv_forward_kernel(E* out, const E* qkv, int T, int NH, int KVH, int hs, float theta,
                              const int32_t* positions) {
    extern __shared__ float table[];  // (hs)
    const int n = blockIdx.x;
    row_angles(table, position_of(positions, n, T), hs, theta);
    const int half = hs / 2, group = NH / KVH, pairs = NH * half;
    const std::size_t channels = static_cast<std::size_t>(NH) * hs;
    const std::size_t kv = static_cast<std::size_t>(KVH) * hs;  // one of k and v
    const E* x_row = qkv + static_cast<std::size_t>(n) * (channels + 2 * kv);
    E* y = out + static_cast<std::size_t>(n) * 3 * channels;
    for (int j = threadIdx.x; j < 3 * pairs; j += blockDim.x) {
        const int part = j / pairs, h = j % pairs / half, i = j % half;
        const E* x = x_row + grouped_part(part, channels, kv) +
                     static_cast<std::size_t>(part == 0 ? h : h / group) * hs + i;
        E* to = y + part * channels + static_cast<std::size_t>(h) * hs + i;
        if (part == 2) {
            to[0] = x[0];
            to[half] = x[half];
            continue;
        }
        const float lo = to_float(x[0]), hi = to_float(x[half]), c = table[i], s = table[half + i];
        to[0] = from_float<E>(lo * c - hi * s);
        to[half] = from_float<E>(hi * c + lo * s);
    }
}

// Row n of dqkv += the gradient from row n of dout: each query head's pair rotated back; each
// key/value head's pair the sum over its group of query heads, in head order (k rotated
// back), added once. A thread owns each pair it writes, so nothing is added twice.
template <typename E>
__global__ void __launch_bounds__(kThreads)
    rotary_qkv_backward_kernel(E* dqkv, const E* dout, int T, int NH, int KVH, int hs, float theta,
                               const int32_t* positions) {
    extern __shared__ float table[];  // (hs)
    const int n = blockIdx.x;
    row_angles(table, position_of(positions, n, T), hs, theta);
    const int half = hs / 2, group = NH / KVH, q_pairs = NH * half, kv_pairs = KVH * half;
    const std::size_t channels = static_cast<std::size_t>(NH) * hs;
    const std::size_t kv = static_cast<std::size_t>(KVH) * hs;  // one of k and v
    E* d_row = dqkv + static_cast<std::size_t>(n) * (channels + 2 * kv);
    const E* dy = dout + static_cast<std::size_t>(n) * 3 * channels;
    for (int j = threadIdx.x; j < q_pairs + 2 * kv_pairs; j += blockDim.x) {
        const int i = j % half;
        const float c = table[i], s = table[half + i];
        // Query head h reads part 0 of dout at head h; a key (value) head kh the group's heads
        // of part 1 (2).
        const bool query = j < q_pairs, key = !query && j < q_pairs + kv_pairs;
        const int head = query ? j / half : (j - q_pairs) % kv_pairs / half;
        const int part = query ? 0 : key ? 1 : 2, first = query ? head : head * group;
        const int last = query ? head + 1 : first + group;
        E* to = d_row + grouped_part(part, channels, kv) + static_cast<std::size_t>(head) * hs + i;
        float lo = to_float(to[0]), hi = to_float(to[half]);
        for (int h = first; h < last; ++h) {
            const E* g = dy + part * channels + static_cast<std::size_t>(h) * hs + i;
            const float g_lo = to_float(g[0]), g_hi = to_float(g[half]);
            if (part == 2) {
                lo += g_lo;
                hi += g_hi;
            } else {  // the transpose of the rotation
                lo += g_lo * c + g_hi * s;
                hi += g_hi * c - g_lo * s;
            }
        }
        to[0] = from_float<E>(lo);
        to[half] = from_float<E>(hi);
    }
}

// The block's shared memory: hs floats, far below any GPU's 48 KiB for a head size any
// attention kernel takes.
std::size_t table_bytes(int hs) {
    const std::size_t bytes = static_cast<std::size_t>(hs) * sizeof(float);
    if (hs <= 0 || hs % 2 != 0 || bytes > 48 * 1024)
        throw Error("internal: rotary positions for heads of " + std::to_string(hs) + " elements");
    return bytes;
}

}  // namespace

template <typename E>
void rotary_qkv_forward(E* out, const E* qkv, int B, int T, int NH, int KVH, int hs, float theta,
                        const int32_t* positions, cudaStream_t stream) {
    if (B * T == 0) return;
    rotary_qkv_forward_kernel<<<static_cast<unsigned>(B * T), kThreads, table_bytes(hs), stream>>>(
        out, qkv, T, NH, KVH, hs, theta, positions);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

template <typename E>
void rotary_qkv_backward(E* dqkv, const E* dout, int B, int T, int NH, int KVH, int hs, float theta,
                         const int32_t* positions, cudaStream_t stream) {
    if (B * T == 0) return;
    rotary_qkv_backward_kernel<<<static_cast<unsigned>(B * T), kThreads, table_bytes(hs), stream>>>(
        dqkv, dout, T, NH, KVH, hs, theta, positions);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

#define TRIDENT_INSTANTIATE(E)                                                         \
    template void rotary_qkv_forward<E>(E*, const E*, int, int, int, int, int, float,  \
                                        const int32_t*, cudaStream_t);                 \
    template void rotary_qkv_backward<E>(E*, const E*, int, int, int, int, int, float, \
                                         const int32_t*, cudaStream_t);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(__nv_bfloat16)
TRIDENT_INSTANTIATE(__half)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::kernels::cuda
