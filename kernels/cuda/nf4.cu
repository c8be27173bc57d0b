// The 4-bit frozen base's dequantization on the GPU (kernels/ops.h, nf4_dequantize; the format
// in kernels/nf4.h): one thread per byte of codes writes its two elements, each its code-book
// value times its block's absmax in fp32 (nf4_absmax under double quantization, the host's
// function), then rounded to the output's type. The code book goes by value with the launch.
// Bit for bit the CPU's (tests/cuda/test_nf4.cpp).
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/elements.cuh"
#include "kernels/nf4.h"

namespace trident::kernels::cuda {

namespace {

constexpr int kThreads = 256;

struct CodeBook {
    float value[kNf4Codes.size()];
};

__device__ __forceinline__ float block_absmax(const Nf4Matrix& m, std::size_t b) {
    if (m.absmax) return m.absmax[b];
    return nf4_absmax(m.absmax_q[b], m.absmax_scale[m.map.whole(b) / kNf4AbsmaxBlock],
                      *m.absmax_mean);
}

template <typename E>
__global__ void nf4_dequantize_kernel(E* out, Nf4Matrix m, CodeBook book) {
    const std::size_t pair = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const std::size_t i = 2 * pair;
    if (i >= m.count) return;
    const uint8_t byte = m.codes[pair];
    out[i] = from_float<E>(book.value[byte & 0xF] * block_absmax(m, i / m.block));
    if (i + 1 < m.count)
        out[i + 1] = from_float<E>(book.value[byte >> 4] * block_absmax(m, (i + 1) / m.block));
}

}  // namespace

void nf4_dequantize(Ptr out, const Nf4Matrix& m, cudaStream_t stream) {
    if (m.count == 0) return;
    CodeBook book;
    std::copy(kNf4Codes.begin(), kNf4Codes.end(), book.value);
    const std::size_t pairs = (m.count + 1) / 2;
    const auto blocks = static_cast<unsigned>((pairs + kThreads - 1) / kThreads);
    dispatch(out.dtype, [&](auto e) {
        using E = decltype(e);
        nf4_dequantize_kernel<E><<<blocks, kThreads, 0, stream>>>(as<E>(out), m, book);
        TRIDENT_CUDA_CHECK_LAUNCH();
    });
}

}  // namespace trident::kernels::cuda
