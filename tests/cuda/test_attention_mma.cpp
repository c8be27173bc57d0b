// The tensor-core flash kernels (bf16 and fp16, kernels/cuda/attention_mma.cu) called
// directly, so that cuDNN taking a shape does not hide them: outputs and gradients against the
// CPU backend at head sizes 15 to 128 (padded to 16, 32, 64, 128; odd ones read element by
// element), sequences of 1 row, of a tile and one, and of several key tiles, with and without
// attention dropout; their log-sum-exp against the fp32 kernels'; the statistics alone bit for
// bit as a full forward's. Then their speed beside cuDNN's on GPT-2's attention, printed (not
// asserted: docs/PERF.md records it).
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_allocator.h"
#include "tests/cuda/backends.h"

using namespace gpu_test;
namespace cuda = trident::kernels::cuda;

namespace {

struct Shape {
    int B, T, channels, NH;
    float drop;
};

template <typename E>
void forward(Ptr out, Ptr lse, ConstPtr qkv, const Shape& s, int heads_total) {
    cuda::flash_attention_forward(static_cast<E*>(out.data), lse.f32(),
                                  static_cast<const E*>(qkv.data), s.B, s.T, s.channels, s.NH,
                                  s.drop, 99, 1, heads_total, cuda::compute_stream());
}

template <typename E>
void backward(Ptr dqkv, Ptr row_dot, ConstPtr dout, ConstPtr qkv, ConstPtr out, ConstPtr lse,
              const Shape& s, int heads_total) {
    cuda::flash_attention_backward(static_cast<E*>(dqkv.data), row_dot.f32(),
                                   static_cast<const E*>(dout.data),
                                   static_cast<const E*>(qkv.data), static_cast<const E*>(out.data),
                                   static_cast<const float*>(lse.data), s.B, s.T, s.channels, s.NH,
                                   s.drop, 99, 1, heads_total, cuda::compute_stream());
}

template <typename E>
void against_cpu(Backends& b, DType t, const Shape& s) {
    INFO(name(t) << ", B " << s.B << " T " << s.T << " channels " << s.channels << " NH " << s.NH
                 << " drop " << s.drop);
    const std::size_t BTC = std::size_t(s.B) * s.T * s.channels,
                      rows = std::size_t(s.B) * s.NH * s.T;
    const int heads_total = 2 * s.NH;  // heads 1.. of twice as many: the mask's global index
    const auto saved = b.cpu->attention_saved(s.B, s.NH, s.T, t);
    Pair qkv(b, 3 * BTC, t), out(b, BTC, t), probs(b, saved.count, saved.dtype),
        lse(b, rows, DType::f32), stats(b, rows, DType::f32);
    qkv.fill(1);
    b.cpu->attention_forward(out.cpu, probs.cpu, qkv.cpu, s.B, s.T, s.channels, s.NH, s.drop, 99, 1,
                             heads_total);
    forward<E>(out.gpu, lse.gpu, qkv.gpu, s, heads_total);
    require_within(out.on_gpu(), out.on_cpu(), attention_tolerance(t), "tensor-core forward");
    // The statistics alone (selective recompute's rebuild): the same bits.
    cuda::flash_attention_forward(static_cast<E*>(nullptr), stats.gpu.f32(),
                                  static_cast<const E*>(qkv.gpu.data), s.B, s.T, s.channels, s.NH,
                                  s.drop, 99, 1, heads_total, cuda::compute_stream());
    REQUIRE(stats.on_gpu() == lse.on_gpu());
    // The fp32 kernels' statistics on the same (widened) inputs.
    Pair wide(b, 3 * BTC, DType::f32), wide_out(b, BTC, DType::f32);
    wide.set(qkv.on_gpu());
    cuda::flash_attention_forward(static_cast<float*>(wide_out.gpu.data), stats.gpu.f32(),
                                  static_cast<const float*>(wide.gpu.data), s.B, s.T, s.channels,
                                  s.NH, s.drop, 99, 1, heads_total, cuda::compute_stream());
    require_within(lse.on_gpu(), stats.on_gpu(), 1e-5, "tensor-core log-sum-exp");

    Pair dout(b, BTC, t), dqkv(b, 3 * BTC, t), row_dot(b, rows, DType::f32);
    dout.fill(2);
    dqkv.fill(3, 0.1f);  // the gradient is added
    b.cpu->attention_backward(dqkv.cpu, dout.cpu, qkv.cpu, out.cpu, probs.cpu, s.B, s.T, s.channels,
                              s.NH, s.drop, 99, 1, heads_total);
    backward<E>(dqkv.gpu, row_dot.gpu, dout.gpu, qkv.gpu, out.gpu, lse.gpu, s, heads_total);
    require_within(dqkv.on_gpu(), dqkv.on_cpu(), attention_tolerance(t), "tensor-core backward");
    // q, k and v each: a gradient that were wrong in one part only must not hide in the whole.
    const std::vector<float> gpu = dqkv.on_gpu(), cpu = dqkv.on_cpu();
    for (int part = 0; part < 3; ++part) {
        std::vector<float> g, c;
        for (std::size_t row = 0; row < std::size_t(s.B) * s.T; ++row)
            for (int i = 0; i < s.channels; ++i) {
                g.push_back(gpu[row * 3 * s.channels + part * s.channels + i]);
                c.push_back(cpu[row * 3 * s.channels + part * s.channels + i]);
            }
        require_within(g, c, attention_tolerance(t),
                       std::string("tensor-core backward d") + "qkv"[part]);
    }
}

}  // namespace

TEST_CASE("cuda: tensor-core flash attention against the CPU", "[attention]") {
    Backends b;
    // Head sizes 16, 32, 64, 128 (and 15, 24, 100: padded, read element by element); T of 1, of
    // a tile and one, and past several key tiles of 32 (heads of 128) and 64.
    for (const Shape& s :
         {Shape{2, 37, 64, 4, 0.0f}, Shape{1, 70, 96, 3, 0.1f}, Shape{2, 64, 256, 4, 0.0f},
          Shape{1, 130, 256, 2, 0.1f}, Shape{2, 33, 48, 2, 0.0f}, Shape{1, 40, 200, 2, 0.2f},
          Shape{1, 45, 60, 4, 0.0f}, Shape{1, 1, 64, 1, 0.0f}, Shape{1, 65, 128, 2, 0.0f},
          Shape{2, 200, 512, 4, 0.0f}, Shape{1, 129, 64, 1, 0.1f}}) {
        against_cpu<__nv_bfloat16>(b, DType::bf16, s);
        against_cpu<__half>(b, DType::f16, s);
    }
}

namespace {

// Milliseconds per call of f, over `calls` after one warm-up, the device waited for.
template <typename F>
double milliseconds(int calls, F f) {
    f();
    cuda::synchronize();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) f();
    cuda::synchronize();
    const std::chrono::duration<double, std::milli> spent =
        std::chrono::steady_clock::now() - start;
    return spent.count() / calls;
}

}  // namespace

TEST_CASE("cuda: tensor-core flash attention beside cuDNN on GPT-2's attention", "[attention]") {
    // GPT-2 124M's attention at micro batch 8: 12 heads of 64, T 1024, bf16.
    const int B = 8, T = 1024, channels = 768, NH = 12;
    const std::size_t BTC = std::size_t(B) * T * channels, rows = std::size_t(B) * NH * T;
    cuda::DeviceAllocator allocator;
    const auto buffer = [&](std::size_t bytes) {
        void* p = allocator.allocate(bytes);
        REQUIRE(cudaMemsetAsync(p, 0x3C, bytes, cuda::compute_stream()) == cudaSuccess);
        return p;
    };
    using E = __nv_bfloat16;
    auto* qkv = static_cast<E*>(buffer(3 * BTC * 2));
    auto* out = static_cast<E*>(buffer(BTC * 2));
    auto* dout = static_cast<E*>(buffer(BTC * 2));
    auto* dqkv = static_cast<E*>(buffer(3 * BTC * 2));
    auto* lse = static_cast<float*>(buffer(rows * 4));
    auto* row_dot = static_cast<float*>(buffer(rows * 4));
    const cudaStream_t stream = cuda::compute_stream();
    const double forward = milliseconds(10, [&] {
        cuda::flash_attention_forward(out, lse, qkv, B, T, channels, NH, 0.0f, 0, 0, NH, stream);
    });
    const double both = milliseconds(10, [&] {
        cuda::flash_attention_forward(out, lse, qkv, B, T, channels, NH, 0.0f, 0, 0, NH, stream);
        cuda::flash_attention_backward(dqkv, row_dot, dout, qkv, out, lse, B, T, channels, NH, 0.0f,
                                       0, 0, NH, stream);
    });
    std::printf(
        "timing: tensor-core flash attention, B %d T %d %d heads of %d, bf16: forward "
        "%.3f ms, forward + backward %.3f ms\n",
        B, T, NH, channels / NH, forward, both);
    cuda::CudnnAttention cudnn(allocator);
    if (cudnn.supports(DType::bf16, B, T, channels, NH)) {
        const Ptr o(out, DType::bf16), g(dqkv, DType::bf16);
        const ConstPtr q(qkv, DType::bf16), d(dout, DType::bf16);
        const double cudnn_forward =
            milliseconds(10, [&] { cudnn.forward(o, lse, q, B, T, channels, NH, stream); });
        const double cudnn_both = milliseconds(10, [&] {
            cudnn.forward(o, lse, q, B, T, channels, NH, stream);
            cudnn.backward(g, d, q, o, lse, B, T, channels, NH, stream);
        });
        std::printf(
            "timing: cuDNN fused attention, same shape: forward %.3f ms, forward + "
            "backward %.3f ms; tensor-core / cuDNN: %.2fx, %.2fx\n",
            cudnn_forward, cudnn_both, forward / cudnn_forward, both / cudnn_both);
    }
    for (void* p : {static_cast<void*>(qkv), static_cast<void*>(out), static_cast<void*>(dout),
                    static_cast<void*>(dqkv), static_cast<void*>(lse), static_cast<void*>(row_dot)})
        allocator.release(p);
    cuda::synchronize();
}
