// Llama's layer on the GPU: the kernels of rmsnorm.cu, rotary.cu and swiglu.cu chosen by the
// element types of the arguments (see llama_ops.h).
#include "kernels/cuda/llama_ops.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/dispatch.h"

namespace trident::kernels::cuda {

void LlamaOps::rmsnorm_forward(Ptr out, float* rstd, ConstPtr inp, ConstPtr weight, int N,
                               int channels, float eps) {
    if (all_of_type(inp.dtype, {out, weight})) {
        dispatch(inp.dtype, [&](auto e) {
            using E = decltype(e);
            cuda::rmsnorm_forward(as<E>(out), rstd, as<E>(inp), as<E>(weight), N, channels, eps,
                                  stream_);
        });
        return;
    }
    auto v = views();
    const std::size_t NC = static_cast<std::size_t>(N) * channels;
    const float* x = v.in(inp, NC);
    const float* w = v.in(weight, channels);
    cuda::rmsnorm_forward(v.out(out, NC), rstd, x, w, N, channels, eps, stream_);
    v.commit();
}

void LlamaOps::rmsnorm_backward(Ptr dinp, Ptr dweight, ConstPtr dout, ConstPtr inp, ConstPtr weight,
                                const float* rstd, int N, int channels) {
    const Scratch scratch(allocator_, rmsnorm_backward_scratch(N, channels) * sizeof(float));
    if (all_of_type(inp.dtype, {dinp, dout, weight})) {
        // The weight's gradient may be of any type; the kernel converts as it adds.
        dispatch(inp.dtype, [&](auto e) {
            using E = decltype(e);
            cuda::rmsnorm_backward(as<E>(dinp), dweight, scratch.floats(), as<E>(dout), as<E>(inp),
                                   as<E>(weight), rstd, N, channels, stream_);
        });
        return;
    }
    auto v = views();
    const std::size_t NC = static_cast<std::size_t>(N) * channels;
    cuda::rmsnorm_backward(v.inout(dinp, NC), v.inout(dweight, channels), scratch.floats(),
                           v.in(dout, NC), v.in(inp, NC), v.in(weight, channels), rstd, N, channels,
                           stream_);
    v.commit();
}

void LlamaOps::rotary_qkv_forward(Ptr out, ConstPtr qkv, int B, int T, int NH, int KVH, int hs,
                                  float theta, const int32_t* positions) {
    if (all_of_type(out.dtype, {qkv})) {
        dispatch(out.dtype, [&](auto e) {
            using E = decltype(e);
            cuda::rotary_qkv_forward(as<E>(out), as<E>(qkv), B, T, NH, KVH, hs, theta, positions,
                                     stream_);
        });
        return;
    }
    auto v = views();
    const std::size_t rows = static_cast<std::size_t>(B) * T;
    const float* in = v.in(qkv, rows * (NH + 2 * KVH) * hs);
    cuda::rotary_qkv_forward(v.out(out, rows * 3 * NH * hs), in, B, T, NH, KVH, hs, theta,
                             positions, stream_);
    v.commit();
}

void LlamaOps::rotary_qkv_backward(Ptr dqkv, ConstPtr dout, int B, int T, int NH, int KVH, int hs,
                                   float theta, const int32_t* positions) {
    if (all_of_type(dqkv.dtype, {dout})) {
        dispatch(dqkv.dtype, [&](auto e) {
            using E = decltype(e);
            cuda::rotary_qkv_backward(as<E>(dqkv), as<E>(dout), B, T, NH, KVH, hs, theta, positions,
                                      stream_);
        });
        return;
    }
    auto v = views();
    const std::size_t rows = static_cast<std::size_t>(B) * T;
    const float* d = v.in(dout, rows * 3 * NH * hs);
    cuda::rotary_qkv_backward(v.inout(dqkv, rows * (NH + 2 * KVH) * hs), d, B, T, NH, KVH, hs,
                              theta, positions, stream_);
    v.commit();
}

void LlamaOps::swiglu_forward(Ptr out, ConstPtr inp, int N, int F) {
    if (all_of_type(out.dtype, {inp})) {
        dispatch(out.dtype, [&](auto e) {
            using E = decltype(e);
            cuda::swiglu_forward(as<E>(out), as<E>(inp), N, F, stream_);
        });
        return;
    }
    auto v = views();
    const std::size_t NF = static_cast<std::size_t>(N) * F;
    const float* in = v.in(inp, 2 * NF);
    cuda::swiglu_forward(v.out(out, NF), in, N, F, stream_);
    v.commit();
}

void LlamaOps::swiglu_backward(Ptr dinp, ConstPtr inp, ConstPtr dout, int N, int F) {
    if (all_of_type(dinp.dtype, {inp, dout})) {
        dispatch(dinp.dtype, [&](auto e) {
            using E = decltype(e);
            cuda::swiglu_backward(as<E>(dinp), as<E>(inp), as<E>(dout), N, F, stream_);
        });
        return;
    }
    auto v = views();
    const std::size_t NF = static_cast<std::size_t>(N) * F;
    cuda::swiglu_backward(v.inout(dinp, 2 * NF), v.in(inp, 2 * NF), v.in(dout, NF), N, F, stream_);
    v.commit();
}

}  // namespace trident::kernels::cuda
