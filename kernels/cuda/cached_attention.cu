// Attention of new tokens against a key/value cache on the GPU (kernels/ops.h,
// cached_attention_forward; model/kv_cache.h): the new rows' keys and values written into the
// cache, then one block per (row, query head) attending to the cache's positions up to the
// row's own. fp32, as the op is; the scores of a row (at most seq_len) sit in shared memory,
// which past 48 KiB (12,160 positions) a kernel must ask for (cudaFuncSetAttribute) and past
// the GPU's per-block limit (about 58,000 positions on Hopper) cannot have: an error naming
// the limit.
#include <cmath>
#include <cstddef>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device.h"
#include "kernels/error.h"

namespace trident::kernels::cuda {

namespace {

constexpr int kThreads = 128;
// Dynamic shared memory a kernel may use without asking.
constexpr std::size_t kDefaultSharedBytes = 48 * 1024;

// Element i of the new rows' k and v (rows, KVH·hs): key/value head g is query head
// g·(NH/KVH)'s in qkv (rows, 3·NH·hs).
__global__ void append_kernel(float* k_cache, float* v_cache, const float* qkv, int rows, int first,
                              int NH, int KVH, int hs) {
    const std::size_t width = static_cast<std::size_t>(KVH) * hs;
    const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= static_cast<std::size_t>(rows) * width) return;
    const std::size_t r = i / width, e = i % width;
    const std::size_t g = e / hs, x = e % hs;
    const std::size_t channels = static_cast<std::size_t>(NH) * hs;
    const float* row = qkv + r * 3 * channels + g * (NH / KVH) * hs + x;
    const std::size_t to = (first + r) * width + e;
    k_cache[to] = row[channels];
    v_cache[to] = row[2 * channels];
}

// A block's sum (op: max or +) of each thread's value, the same in every thread.
template <bool Max>
__device__ float block_reduce(float value, float* shared) {
    shared[threadIdx.x] = value;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) {
            const float other = shared[threadIdx.x + stride];
            shared[threadIdx.x] =
                Max ? fmaxf(shared[threadIdx.x], other) : shared[threadIdx.x] + other;
        }
        __syncthreads();
    }
    const float result = shared[0];
    __syncthreads();
    return result;
}

// Block (r, h): out row r, head h = softmax(q k_j / sqrt(hs), j <= first + r) · v_j, over key
// /value head h / (NH/KVH). Dynamic shared memory: the scores (first + rows floats), then
// kThreads for the reductions.
__global__ void attend_kernel(float* out, const float* k_cache, const float* v_cache,
                              const float* qkv, int first, int NH, int KVH, int hs) {
    extern __shared__ float shared[];
    const int r = blockIdx.x, h = blockIdx.y, last = first + r;
    float* scores = shared;
    float* reduce = shared + first + gridDim.x;  // after the scores of every row's keys
    const std::size_t channels = static_cast<std::size_t>(NH) * hs;
    const std::size_t width = static_cast<std::size_t>(KVH) * hs;
    const std::size_t g = static_cast<std::size_t>(h / (NH / KVH)) * hs;
    const float* q = qkv + r * 3 * channels + static_cast<std::size_t>(h) * hs;
    const float scale = rsqrtf(static_cast<float>(hs));
    float max = -INFINITY;
    for (int j = threadIdx.x; j <= last; j += blockDim.x) {
        const float* k = k_cache + j * width + g;
        float s = 0.0f;
        for (int i = 0; i < hs; i++) s += q[i] * k[i];
        scores[j] = s * scale;
        max = fmaxf(max, scores[j]);
    }
    max = block_reduce<true>(max, reduce);
    float sum = 0.0f;
    for (int j = threadIdx.x; j <= last; j += blockDim.x) {
        scores[j] = expf(scores[j] - max);
        sum += scores[j];
    }
    sum = block_reduce<false>(sum, reduce);
    for (int i = threadIdx.x; i < hs; i += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j <= last; j++) acc += scores[j] * v_cache[j * width + g + i];
        out[r * channels + static_cast<std::size_t>(h) * hs + i] = acc / sum;
    }
}

}  // namespace

void cached_attention_forward(float* out, float* k_cache, float* v_cache, const float* qkv,
                              int rows, int first, int NH, int KVH, int hs, cudaStream_t stream) {
    // The scores of every position up to the last row's, then the reductions' floats.
    const std::size_t shared = (static_cast<std::size_t>(first + rows) + kThreads) * sizeof(float);
    const std::size_t limit = gpu_properties().sharedMemPerBlockOptin;
    if (shared > limit)
        throw Error(
            "attention against the key/value cache keeps a row's scores in shared memory: " +
            std::to_string(first + rows) + " positions need " + std::to_string(shared) +
            " bytes, more than the " + std::to_string(limit) +
            " a block may have on this GPU (at most " +
            std::to_string(limit / sizeof(float) - kThreads) + " positions)");
    if (shared > kDefaultSharedBytes)
        TRIDENT_CUDA_CHECK(cudaFuncSetAttribute(
            attend_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
    const std::size_t elements = static_cast<std::size_t>(rows) * KVH * hs;
    append_kernel<<<blocks_for(elements, kThreads), kThreads, 0, stream>>>(
        k_cache, v_cache, qkv, rows, first, NH, KVH, hs);
    TRIDENT_CUDA_CHECK_LAUNCH();
    attend_kernel<<<dim3(static_cast<unsigned>(rows), static_cast<unsigned>(NH)), kThreads, shared,
                    stream>>>(out, k_cache, v_cache, qkv, first, NH, KVH, hs);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

}  // namespace trident::kernels::cuda
