// SwiGLU (Shazeer 2020), the input of Llama's down projection, forward and backward:
// out (N,F) = silu(gate) * up from inp (N,2F) holding each row's gate then up (the fused gate
// and up linears' output).
//
// Memory-bound, one pass over each operand. Each thread takes W elements of a row at a time:
// a 16-byte pack (elements.cuh) when F is a multiple of a pack and the buffers are aligned to
// one (then every row's gate, up and out start on a pack), else single elements.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/elements.cuh"

namespace trident::kernels::cuda {

namespace {

constexpr unsigned kThreads = 256;

template <typename E, int W>
__device__ __forceinline__ void load(float (&x)[W], const E* p) {
    if constexpr (W == 1) {
        x[0] = to_float(*p);
    } else {
        const Pack<E> pack = load_pack(p);
#pragma unroll
        for (int e = 0; e < W; ++e) x[e] = to_float(pack.v[e]);
    }
}

template <typename E, int W>
__device__ __forceinline__ void store(E* p, const float (&x)[W]) {
    if constexpr (W == 1) {
        *p = from_float<E>(x[0]);
    } else {
        Pack<E> pack;
#pragma unroll
        for (int e = 0; e < W; ++e) pack.v[e] = from_float<E>(x[e]);
        store_pack(p, pack);
    }
}

// Item `it` of the rows' W-element slices: its row n and first column f.
struct Slice {
    std::size_t n, f;
};
template <int W>
__device__ __forceinline__ Slice slice(std::size_t it, int F) {
    const std::size_t per_row = static_cast<std::size_t>(F / W);
    return {it / per_row, it % per_row * W};
}

// out = silu(g) * u = g / (1 + e^-g) * u
template <typename E, int W>
__global__ void __launch_bounds__(kThreads)
    swiglu_forward_kernel(E* out, const E* inp, std::size_t items, int F) {
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t it = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
         it < items; it += stride) {
        const Slice at = slice<W>(it, F);
        const E* row = inp + at.n * 2 * F + at.f;
        float g[W], u[W], y[W];
        load(g, row);
        load(u, row + F);
#pragma unroll
        for (int e = 0; e < W; ++e) y[e] = g[e] / (1.0f + expf(-g[e])) * u[e];
        store(out + at.n * F + at.f, y);
    }
}

// With s = sigmoid(g): dgate += dout * u * s * (1 + g (1 - s)), dup += dout * g * s.
template <typename E, int W>
__global__ void __launch_bounds__(kThreads)
    swiglu_backward_kernel(E* dinp, const E* inp, const E* dout, std::size_t items, int F) {
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t it = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
         it < items; it += stride) {
        const Slice at = slice<W>(it, F);
        const std::size_t in = at.n * 2 * F + at.f;
        float g[W], u[W], dy[W], dg[W], du[W];
        load(g, inp + in);
        load(u, inp + in + F);
        load(dy, dout + at.n * F + at.f);
        load(dg, dinp + in);
        load(du, dinp + in + F);
#pragma unroll
        for (int e = 0; e < W; ++e) {
            const float s = 1.0f / (1.0f + expf(-g[e]));
            dg[e] += dy[e] * u[e] * s * (1.0f + g[e] * (1.0f - s));
            du[e] += dy[e] * g[e] * s;
        }
        store(dinp + in, dg);
        store(dinp + in + F, du);
    }
}

// Whether the kernels may take whole packs of these buffers with rows of F elements.
template <typename E>
bool packed(int F, const void* a, const void* b, const void* c) {
    return F % kPack<E> == 0 && pack_aligned(a) && pack_aligned(b) && pack_aligned(c);
}

}  // namespace

template <typename E>
void swiglu_forward(E* out, const E* inp, int N, int F, cudaStream_t stream) {
    const std::size_t count = static_cast<std::size_t>(N) * F;
    if (count == 0) return;
    if (packed<E>(F, out, inp, inp)) {
        constexpr int W = kPack<E>;
        swiglu_forward_kernel<E, W>
            <<<blocks_for(count / W, kThreads), kThreads, 0, stream>>>(out, inp, count / W, F);
    } else {
        swiglu_forward_kernel<E, 1>
            <<<blocks_for(count, kThreads), kThreads, 0, stream>>>(out, inp, count, F);
    }
    TRIDENT_CUDA_CHECK_LAUNCH();
}

template <typename E>
void swiglu_backward(E* dinp, const E* inp, const E* dout, int N, int F, cudaStream_t stream) {
    const std::size_t count = static_cast<std::size_t>(N) * F;
    if (count == 0) return;
    if (packed<E>(F, dinp, inp, dout)) {
        constexpr int W = kPack<E>;
        swiglu_backward_kernel<E, W><<<blocks_for(count / W, kThreads), kThreads, 0, stream>>>(
            dinp, inp, dout, count / W, F);
    } else {
        swiglu_backward_kernel<E, 1>
            <<<blocks_for(count, kThreads), kThreads, 0, stream>>>(dinp, inp, dout, count, F);
    }
    TRIDENT_CUDA_CHECK_LAUNCH();
}

#define TRIDENT_INSTANTIATE(E)                                             \
    template void swiglu_forward<E>(E*, const E*, int, int, cudaStream_t); \
    template void swiglu_backward<E>(E*, const E*, const E*, int, int, cudaStream_t);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(__nv_bfloat16)
TRIDENT_INSTANTIATE(__half)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::kernels::cuda
