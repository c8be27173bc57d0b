// cuDNN's fused attention against the built-in flash-attention kernels, which the ops tests
// hold against the CPU: outputs, log-sum-exp statistics and gradients, and either backward
// after either forward (their statistics mean the same).
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/dtype.h"
#include "kernels/random.h"
#include "tests/cuda/backends.h"

using namespace trident::kernels;
using gpu_test::relative_error;

namespace {

// A device buffer of `count` elements of `t` from the test's allocator.
struct Buffer {
    cuda::DeviceAllocator& allocator;
    DType type;
    std::size_t count;
    void* data;
    Buffer(cuda::DeviceAllocator& a, DType t, std::size_t n)
        : allocator(a), type(t), count(n), data(a.allocate(n * size_of(t))) {
        TRIDENT_CUDA_CHECK(cudaMemset(data, 0, n * size_of(t)));
    }
    ~Buffer() { allocator.release(data); }
    void upload(const std::vector<float>& values) {
        std::vector<uint16_t> narrow16(count);
        trident::kernels::narrow(Ptr(narrow16.data(), type), values.data(), count);
        TRIDENT_CUDA_CHECK(cudaMemcpy(data, narrow16.data(), count * 2, cudaMemcpyHostToDevice));
    }
    std::vector<float> download() const {
        std::vector<float> values(count);
        if (type == DType::f32) {
            TRIDENT_CUDA_CHECK(cudaMemcpy(values.data(), data, count * 4, cudaMemcpyDeviceToHost));
            return values;
        }
        std::vector<uint16_t> raw(count);
        TRIDENT_CUDA_CHECK(cudaMemcpy(raw.data(), data, count * 2, cudaMemcpyDeviceToHost));
        widen(values.data(), ConstPtr(raw.data(), type), count);
        return values;
    }
};

template <typename E>
void flash_forward(Buffer& out, Buffer& lse, const Buffer& qkv, int B, int T, int C, int NH) {
    cuda::flash_attention_forward(static_cast<E*>(out.data), static_cast<float*>(lse.data),
                                  static_cast<const E*>(qkv.data), B, T, C, NH, 0.0f, 0, 0, NH,
                                  cuda::compute_stream());
}

template <typename E>
void flash_backward(Buffer& dqkv, Buffer& scratch, const Buffer& dout, const Buffer& qkv,
                    const Buffer& out, const Buffer& lse, int B, int T, int C, int NH) {
    cuda::flash_attention_backward(static_cast<E*>(dqkv.data), static_cast<float*>(scratch.data),
                                   static_cast<const E*>(dout.data),
                                   static_cast<const E*>(qkv.data), static_cast<const E*>(out.data),
                                   static_cast<const float*>(lse.data), B, T, C, NH, 0.0f, 0, 0, NH,
                                   cuda::compute_stream());
}

template <typename E>
void compare(DType t, int B, int T, int C, int NH) {
    cuda::DeviceAllocator allocator;
    cuda::CudnnAttention cudnn(allocator);
    const cudaDataType_t type = t == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F;
    std::string why;
    const bool supported = cudnn.supports(type, B, T, C, NH, &why);
    INFO("cuDNN " << cudnnGetVersion() << ": " << why);
    REQUIRE(supported);  // head sizes 64 and 128 in bf16/fp16 have engines on Ampere and Hopper

    const std::size_t BTC = static_cast<std::size_t>(B) * T * C,
                      rows = static_cast<std::size_t>(B) * NH * T;
    Buffer qkv(allocator, t, 3 * BTC), dout(allocator, t, BTC);
    std::vector<float> values(3 * BTC);
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(normal(11, i));
    qkv.upload(values);
    values.resize(BTC);
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(normal(12, i));
    dout.upload(values);

    Buffer out_flash(allocator, t, BTC), out_cudnn(allocator, t, BTC);
    Buffer lse_flash(allocator, DType::f32, rows), lse_cudnn(allocator, DType::f32, rows);
    flash_forward<E>(out_flash, lse_flash, qkv, B, T, C, NH);
    cudnn.forward(out_cudnn.data, static_cast<float*>(lse_cudnn.data), qkv.data, type, B, T, C, NH,
                  cuda::compute_stream());
    CHECK(relative_error(out_cudnn.download(), out_flash.download()) <= 1e-2);
    CHECK(relative_error(lse_cudnn.download(), lse_flash.download()) <= 1e-4);

    Buffer scratch(allocator, DType::f32, rows);
    Buffer grad_flash(allocator, t, 3 * BTC), grad_cudnn(allocator, t, 3 * BTC),
        grad_mixed(allocator, t, 3 * BTC);
    flash_backward<E>(grad_flash, scratch, dout, qkv, out_flash, lse_flash, B, T, C, NH);
    cudnn.backward(grad_cudnn.data, dout.data, qkv.data, out_cudnn.data,
                   static_cast<const float*>(lse_cudnn.data), type, B, T, C, NH,
                   cuda::compute_stream());
    CHECK(relative_error(grad_cudnn.download(), grad_flash.download()) <= 1e-2);
    // The flash backward after cuDNN's forward, as CudaOps may run them.
    flash_backward<E>(grad_mixed, scratch, dout, qkv, out_cudnn, lse_cudnn, B, T, C, NH);
    CHECK(relative_error(grad_mixed.download(), grad_flash.download()) <= 1e-2);
    cuda::synchronize();
}

}  // namespace

TEST_CASE("cuda: cuDNN fused attention matches the flash kernels", "[attention]") {
    struct Case {
        int B, T, C, NH;
    };
    for (const Case& k : {Case{2, 128, 256, 4}, Case{1, 200, 768, 12}, Case{2, 64, 256, 2}}) {
        INFO("B " << k.B << " T " << k.T << " C " << k.C << " NH " << k.NH);
        compare<__nv_bfloat16>(DType::bf16, k.B, k.T, k.C, k.NH);
        compare<__half>(DType::f16, k.B, k.T, k.C, k.NH);
    }
}

TEST_CASE("cuda: cuDNN attention refuses what it cannot do, and says why", "[attention]") {
    cuda::DeviceAllocator allocator;
    cuda::CudnnAttention cudnn(allocator);
    std::string why;
    REQUIRE_FALSE(cudnn.supports(CUDA_R_32F, 1, 16, 64, 4, &why));  // fp32
    REQUIRE_FALSE(why.empty());
    REQUIRE_FALSE(cudnn.supports(CUDA_R_16BF, 1, 16, 60, 4, &why));  // head size 15
}
