// Elementwise kernels: GELU, the residual add, ReLU, the product, inverted dropout, the bias add,
// scaling, and conversion between element types.
//
// They are memory-bound: one pass over each operand. map_kernel runs them all: each thread
// takes 16-byte packs of every operand when the pointers are aligned to that (the common
// case: whole buffers from the allocator), else single elements.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/dropout.cuh"
#include "kernels/cuda/elements.cuh"

namespace trident::kernels::cuda {

namespace {

constexpr unsigned kThreads = 256;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

template <typename E, int Inputs>
struct Operands {
    const E* in[Inputs];
};

// out[i] = op(i, {in[0][i], in[1][i], ...}) for i < count; out may be one of the inputs.
template <typename E, int Inputs, typename Op>
__global__ void map_kernel(E* out, Operands<E, Inputs> operands, std::size_t count, bool packed,
                           Op op) {
    constexpr int P = kPack<E>;
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    std::size_t scalar_begin = 0;
    if (packed) {
        const std::size_t packs = count / P;
        for (std::size_t p = first; p < packs; p += stride) {
            Pack<E> x[Inputs];
#pragma unroll
            for (int a = 0; a < Inputs; ++a) x[a] = load_pack(operands.in[a] + p * P);
            Pack<E> y;
#pragma unroll
            for (int e = 0; e < P; ++e) {
                float v[Inputs];
#pragma unroll
                for (int a = 0; a < Inputs; ++a) v[a] = to_float(x[a].v[e]);
                y.v[e] = from_float<E>(op(p * P + e, v));
            }
            store_pack(out + p * P, y);
        }
        scalar_begin = packs * P;
    }
    for (std::size_t i = scalar_begin + first; i < count; i += stride) {
        float v[Inputs];
#pragma unroll
        for (int a = 0; a < Inputs; ++a) v[a] = to_float(operands.in[a][i]);
        out[i] = from_float<E>(op(i, v));
    }
}

template <typename E, int Inputs, typename Op>
void map(E* out, Operands<E, Inputs> operands, std::size_t count, Op op, cudaStream_t stream) {
    if (count == 0) return;
    bool packed = pack_aligned(out);
    for (const E* p : operands.in) packed = packed && pack_aligned(p);
    const std::size_t work = packed ? (count + kPack<E> - 1) / kPack<E> : count;
    map_kernel<<<blocks_for(work, kThreads), kThreads, 0, stream>>>(out, operands, count, packed,
                                                                    op);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

struct GeluForward {
    __device__ float operator()(std::size_t, const float (&v)[1]) const {
        const float x = v[0];
        const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
        return 0.5f * x * (1.0f + tanhf(u));
    }
};

// v = {dinp, inp, dout}
struct GeluBackward {
    __device__ float operator()(std::size_t, const float (&v)[3]) const {
        const float x = v[1];
        const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
        const float th = tanhf(u);
        const float du_dx = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
        const float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du_dx;
        return v[0] + v[2] * grad;
    }
};

struct Add {
    __device__ float operator()(std::size_t, const float (&v)[2]) const { return v[0] + v[1]; }
};

struct Relu {
    __device__ float operator()(std::size_t, const float (&v)[1]) const {
        return v[0] > 0.0f ? v[0] : 0.0f;
    }
};

struct Multiply {
    float factor;
    __device__ float operator()(std::size_t, const float (&v)[2]) const {
        return v[0] * v[1] * factor;
    }
};

// A select, not a multiply by a 0/1 mask: p = 1 gives zeros rather than 0 * inf.
struct DropoutForward {
    uint64_t seed, index_begin;
    float drop_prob, keep_scale;
    __device__ float operator()(std::size_t i, const float (&v)[1]) const {
        return dropout_kept(seed, index_begin + i, drop_prob) ? v[0] * keep_scale : 0.0f;
    }
};

// v = {dinp, dout}
struct DropoutBackward {
    uint64_t seed, index_begin;
    float drop_prob, keep_scale;
    __device__ float operator()(std::size_t i, const float (&v)[2]) const {
        return dropout_kept(seed, index_begin + i, drop_prob) ? v[0] + v[1] * keep_scale : v[0];
    }
};

template <typename E>
struct AddBias {
    const E* bias;
    std::size_t columns;
    __device__ float operator()(std::size_t i, const float (&v)[1]) const {
        return v[0] + to_float(bias[i % columns]);
    }
};

struct ScaleRows {
    const float* factors;
    std::size_t columns;
    __device__ float operator()(std::size_t i, const float (&v)[1]) const {
        return v[0] * factors[i / columns];
    }
};

struct Scale {
    float factor;
    __device__ float operator()(std::size_t, const float (&v)[1]) const { return v[0] * factor; }
};

template <typename TOut, typename TIn>
__global__ void convert_kernel(TOut* out, const TIn* in, std::size_t count) {
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
         i += stride)
        out[i] = from_float<TOut>(to_float(in[i]));
}

// out (rows, cols) strided = in (rows, cols) strided, one thread per element.
template <typename TOut, typename TIn>
__global__ void convert_2d_kernel(TOut* out, std::size_t out_stride, const TIn* in,
                                  std::size_t in_stride, std::size_t rows, std::size_t cols) {
    const std::size_t count = rows * cols;
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
         i += stride) {
        const std::size_t r = i / cols, c = i % cols;
        out[r * out_stride + c] = from_float<TOut>(to_float(in[r * in_stride + c]));
    }
}

}  // namespace

template <typename E>
void gelu_forward(E* out, const E* inp, std::size_t count, cudaStream_t stream) {
    map<E, 1>(out, {{inp}}, count, GeluForward{}, stream);
}

template <typename E>
void gelu_backward(E* dinp, const E* inp, const E* dout, std::size_t count, cudaStream_t stream) {
    map<E, 3>(dinp, {{dinp, inp, dout}}, count, GeluBackward{}, stream);
}

template <typename E>
void residual_forward(E* out, const E* a, const E* b, std::size_t count, cudaStream_t stream) {
    map<E, 2>(out, {{a, b}}, count, Add{}, stream);
}

template <typename E>
void relu_forward(E* out, const E* inp, std::size_t count, cudaStream_t stream) {
    map<E, 1>(out, {{inp}}, count, Relu{}, stream);
}

template <typename E>
void multiply(E* out, const E* a, const E* b, std::size_t count, float factor,
              cudaStream_t stream) {
    map<E, 2>(out, {{a, b}}, count, Multiply{factor}, stream);
}

template <typename E>
void scale_rows(E* out, const E* inp, const float* factors, std::size_t rows, std::size_t cols,
                cudaStream_t stream) {
    map<E, 1>(out, {{inp}}, rows * cols, ScaleRows{factors, cols}, stream);
}

template <typename E>
void dropout_forward(E* out, const E* inp, std::size_t count, float drop_prob, uint64_t seed,
                     uint64_t index_begin, cudaStream_t stream) {
    map<E, 1>(out, {{inp}}, count,
              DropoutForward{seed, index_begin, drop_prob, 1.0f / (1.0f - drop_prob)}, stream);
}

template <typename E>
void dropout_backward(E* dinp, const E* dout, std::size_t count, float drop_prob, uint64_t seed,
                      uint64_t index_begin, cudaStream_t stream) {
    map<E, 2>(dinp, {{dinp, dout}}, count,
              DropoutBackward{seed, index_begin, drop_prob, 1.0f / (1.0f - drop_prob)}, stream);
}

template <typename E>
void add_bias(E* out, const E* bias, int N, int OC, cudaStream_t stream) {
    map<E, 1>(out, {{out}}, static_cast<std::size_t>(N) * OC,
              AddBias<E>{bias, static_cast<std::size_t>(OC)}, stream);
}

template <typename E>
void scale(E* x, std::size_t count, float factor, cudaStream_t stream) {
    map<E, 1>(x, {{x}}, count, Scale{factor}, stream);
}

template <typename TOut, typename TIn>
void convert(TOut* out, const TIn* in, std::size_t count, cudaStream_t stream) {
    if (count == 0) return;
    convert_kernel<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(out, in, count);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

template <typename TOut, typename TIn>
void convert_2d(TOut* out, std::size_t out_stride, const TIn* in, std::size_t in_stride,
                std::size_t rows, std::size_t cols, cudaStream_t stream) {
    if (rows * cols == 0) return;
    convert_2d_kernel<<<blocks_for(rows * cols, kThreads), kThreads, 0, stream>>>(
        out, out_stride, in, in_stride, rows, cols);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

#define TRIDENT_INSTANTIATE(E)                                                                     \
    template void gelu_forward<E>(E*, const E*, std::size_t, cudaStream_t);                        \
    template void gelu_backward<E>(E*, const E*, const E*, std::size_t, cudaStream_t);             \
    template void residual_forward<E>(E*, const E*, const E*, std::size_t, cudaStream_t);          \
    template void relu_forward<E>(E*, const E*, std::size_t, cudaStream_t);                        \
    template void multiply<E>(E*, const E*, const E*, std::size_t, float, cudaStream_t);           \
    template void scale_rows<E>(E*, const E*, const float*, std::size_t, std::size_t,              \
                                cudaStream_t);                                                     \
    template void dropout_forward<E>(E*, const E*, std::size_t, float, uint64_t, uint64_t,         \
                                     cudaStream_t);                                                \
    template void dropout_backward<E>(E*, const E*, std::size_t, float, uint64_t, uint64_t,        \
                                      cudaStream_t);                                               \
    template void add_bias<E>(E*, const E*, int, int, cudaStream_t);                               \
    template void scale<E>(E*, std::size_t, float, cudaStream_t);                                  \
    template void convert<E, float>(E*, const float*, std::size_t, cudaStream_t);                  \
    template void convert<E, __nv_bfloat16>(E*, const __nv_bfloat16*, std::size_t, cudaStream_t);  \
    template void convert<E, __half>(E*, const __half*, std::size_t, cudaStream_t);                \
    template void convert_2d<E, float>(E*, std::size_t, const float*, std::size_t, std::size_t,    \
                                       std::size_t, cudaStream_t);                                 \
    template void convert_2d<E, __nv_bfloat16>(E*, std::size_t, const __nv_bfloat16*, std::size_t, \
                                               std::size_t, std::size_t, cudaStream_t);            \
    template void convert_2d<E, __half>(E*, std::size_t, const __half*, std::size_t, std::size_t,  \
                                        std::size_t, cudaStream_t);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(__nv_bfloat16)
TRIDENT_INSTANTIATE(__half)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::kernels::cuda
