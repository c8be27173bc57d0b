// cuDNN's fused attention against the built-in flash-attention kernels, which the ops tests
// hold against the CPU: outputs, log-sum-exp statistics and gradients, each backward after
// each forward (their statistics mean the same), with the causal mask's form (one operation on
// cuDNN 9.21 and later, else four) and the engines that ran printed; cuDNN refusing what it
// must not run; and the
// backend's choice of kernels per shape: kept for the rebuild of selective recompute, said at
// start-up, and an error at start-up where no kernel can run the model.
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/dtype.h"
#include "kernels/error.h"
#include "kernels/random.h"
#include "tests/cuda/backends.h"

using namespace trident::kernels;
using gpu_test::attention_tolerance;
using gpu_test::relative_error;

namespace {

// A device buffer of `count` elements of `type` from the test's allocator. Every copy and fill
// goes through the compute stream the kernels run on (a non-blocking stream, which the legacy
// default stream of plain cudaMemcpy does not wait for), and reads wait for it.
struct Buffer {
    cuda::DeviceAllocator& allocator;
    DType type;
    std::size_t count;
    void* data;
    Buffer(cuda::DeviceAllocator& a, DType t, std::size_t n)
        : allocator(a), type(t), count(n), data(a.allocate(n * size_of(t))) {
        fill_bytes(0);
    }
    ~Buffer() { allocator.release(data); }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;

    Ptr ptr() const { return Ptr(data, type); }
    // Every byte `value`: 0xFF makes every element a NaN, so an element a kernel should have
    // written and did not fails the comparison.
    void fill_bytes(int value) {
        TRIDENT_CUDA_CHECK(
            cudaMemsetAsync(data, value, count * size_of(type), cuda::compute_stream()));
    }
    void upload(const std::vector<float>& values) {
        REQUIRE(values.size() == count);
        std::vector<char> bytes(count * size_of(type));
        narrow(Ptr(bytes.data(), type), values.data(), count);
        TRIDENT_CUDA_CHECK(cudaMemcpyAsync(data, bytes.data(), bytes.size(), cudaMemcpyHostToDevice,
                                           cuda::compute_stream()));
        cuda::synchronize();  // `bytes` goes out of scope
    }
    std::vector<float> download() const {
        std::vector<char> bytes(count * size_of(type));
        TRIDENT_CUDA_CHECK(cudaMemcpyAsync(bytes.data(), data, bytes.size(), cudaMemcpyDeviceToHost,
                                           cuda::compute_stream()));
        cuda::synchronize();
        std::vector<float> values(count);
        widen(values.data(), ConstPtr(bytes.data(), type), count);
        return values;
    }
};

std::vector<float> normal_values(std::size_t n, uint64_t seed) {
    std::vector<float> values(n);
    for (std::size_t i = 0; i < n; ++i) values[i] = static_cast<float>(normal(seed, i));
    return values;
}

template <typename E>
void flash_forward(Buffer& out, Buffer& lse, const Buffer& qkv, int B, int T, int channels,
                   int NH) {
    cuda::flash_attention_forward(static_cast<E*>(out.data), static_cast<float*>(lse.data),
                                  static_cast<const E*>(qkv.data), B, T, channels, NH, 0.0f, 0, 0,
                                  NH, cuda::compute_stream());
}

// dqkv += the gradient.
template <typename E>
void flash_backward(Buffer& dqkv, Buffer& scratch, const Buffer& dout, const Buffer& qkv,
                    const Buffer& out, const Buffer& lse, int B, int T, int channels, int NH) {
    cuda::flash_attention_backward(static_cast<E*>(dqkv.data), static_cast<float*>(scratch.data),
                                   static_cast<const E*>(dout.data),
                                   static_cast<const E*>(qkv.data), static_cast<const E*>(out.data),
                                   static_cast<const float*>(lse.data), B, T, channels, NH, 0.0f, 0,
                                   0, NH, cuda::compute_stream());
}

void require_close(const Buffer& got, const Buffer& want, double limit, const std::string& what) {
    const double error = relative_error(got.download(), want.download());
    INFO(what << ": relative error " << error);
    REQUIRE(error <= limit);
}

template <typename E>
void compare(DType t, int B, int T, int channels, int NH) {
    cuda::DeviceAllocator allocator;
    cuda::CudnnAttention cudnn(allocator);
    std::string why;
    const bool supported = cudnn.supports(t, B, T, channels, NH, &why);
    // Where this cuDNN must not run the shape, it says so and the flash kernels serve.
    const std::string refusal = cuda::cudnn_attention_refusal(
        cuda::cudnn_version(), cuda::gpu_properties().major, t, T, channels / NH);
    INFO(cuda::describe_cudnn() << ": " << why);
    if (!refusal.empty()) {
        REQUIRE_FALSE(supported);
        REQUIRE(why == refusal);
        return;
    }
    REQUIRE(supported);  // head sizes 64 and 128 in bf16/fp16 have engines on Ampere and Hopper
    // Which form of the causal mask and which engines run the case, for the log.
    const std::string how = cudnn.describe(t, B, T, channels, NH);
    std::printf("cuDNN attention (%s, B %d, T %d, %d heads of %d): %s\n", name_of(t), B, T, NH,
                channels / NH, how.c_str());
    REQUIRE(how.find("the causal mask as ") != std::string::npos);
    REQUIRE(how.find("forward engine ") != std::string::npos);
    REQUIRE(how.find("backward engine ") != std::string::npos);

    const std::size_t BTC = static_cast<std::size_t>(B) * T * channels,
                      rows = static_cast<std::size_t>(B) * NH * T;
    Buffer qkv(allocator, t, 3 * BTC), dout(allocator, t, BTC);
    qkv.upload(normal_values(3 * BTC, 11));
    dout.upload(normal_values(BTC, 12));

    // Forward: cuDNN's output and statistics against the flash kernels', each written over
    // NaNs.
    Buffer out_flash(allocator, t, BTC), out_cudnn(allocator, t, BTC);
    Buffer lse_flash(allocator, DType::f32, rows), lse_cudnn(allocator, DType::f32, rows);
    for (Buffer* b : {&out_flash, &out_cudnn, &lse_flash, &lse_cudnn}) b->fill_bytes(0xFF);
    flash_forward<E>(out_flash, lse_flash, qkv, B, T, channels, NH);
    cudnn.forward(out_cudnn.ptr(), static_cast<float*>(lse_cudnn.data), qkv.ptr(), B, T, channels,
                  NH, cuda::compute_stream());
    require_close(out_cudnn, out_flash, attention_tolerance(t), "forward output");
    require_close(lse_cudnn, lse_flash, 1e-5, "forward log-sum-exp");

    // Backward, each after each forward. cuDNN overwrites its gradient (poisoned first); the
    // flash kernels add into theirs (zeros).
    Buffer scratch(allocator, DType::f32, rows);
    Buffer grad_flash(allocator, t, 3 * BTC), grad_cudnn(allocator, t, 3 * BTC);
    flash_backward<E>(grad_flash, scratch, dout, qkv, out_flash, lse_flash, B, T, channels, NH);
    grad_cudnn.fill_bytes(0xFF);
    cudnn.backward(grad_cudnn.ptr(), dout.ptr(), qkv.ptr(), out_cudnn.ptr(),
                   static_cast<const float*>(lse_cudnn.data), B, T, channels, NH,
                   cuda::compute_stream());
    require_close(grad_cudnn, grad_flash, attention_tolerance(t),
                  "cuDNN backward after cuDNN forward");
    Buffer grad_mixed(allocator, t, 3 * BTC);
    flash_backward<E>(grad_mixed, scratch, dout, qkv, out_cudnn, lse_cudnn, B, T, channels, NH);
    require_close(grad_mixed, grad_flash, attention_tolerance(t),
                  "flash backward after cuDNN forward");
    grad_mixed.fill_bytes(0xFF);
    cudnn.backward(grad_mixed.ptr(), dout.ptr(), qkv.ptr(), out_flash.ptr(),
                   static_cast<const float*>(lse_flash.data), B, T, channels, NH,
                   cuda::compute_stream());
    require_close(grad_mixed, grad_flash, attention_tolerance(t),
                  "cuDNN backward after flash forward");
}

}  // namespace

TEST_CASE("cuda: cuDNN fused attention matches the flash kernels", "[attention]") {
    std::printf("%s\n", cuda::describe_cudnn().c_str());
    struct Case {
        int B, T, channels, NH;
    };
    // T = 200 and 64 are not multiples of 128: refused before cuDNN 9.16 (the comparison is then
    // that refusal).
    for (const Case& k :
         {Case{2, 128, 256, 4}, Case{1, 256, 512, 4}, Case{1, 200, 768, 12}, Case{2, 64, 256, 2}}) {
        INFO("B " << k.B << " T " << k.T << " channels " << k.channels << " NH " << k.NH);
        compare<__nv_bfloat16>(DType::bf16, k.B, k.T, k.channels, k.NH);
        compare<__half>(DType::f16, k.B, k.T, k.channels, k.NH);
    }
}

TEST_CASE("cuda: cuDNN attention refuses what it cannot do, and says why", "[attention]") {
    cuda::DeviceAllocator allocator;
    cuda::CudnnAttention cudnn(allocator);
    std::string why;
    REQUIRE_FALSE(cudnn.supports(DType::f32, 1, 128, 64, 4, &why));
    REQUIRE(why.find("bf16 or fp16") != std::string::npos);
    REQUIRE_FALSE(cudnn.supports(DType::bf16, 1, 128, 60, 4, &why));  // head size 15
    REQUIRE(why.find("multiples of 8") != std::string::npos);
}

// The backend keeps one choice of kernels per shape, so selective recompute's rebuild runs the
// forward's kernels and writes its statistics bit for bit (with dropout the forward runs the
// flash kernels, without it cuDNN where it may).
TEST_CASE("cuda: attention_rebuild writes the forward's statistics exactly", "[attention]") {
    gpu_test::Backends b;
    const int B = 2, T = 128, channels = 256, NH = 4;
    const std::size_t BTC = static_cast<std::size_t>(B) * T * channels;
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
        for (float drop : {0.0f, 0.1f}) {
            INFO(name_of(t) << ", dropout " << drop);
            const auto saved = b.gpu->attention_saved(B, NH, T, t);
            gpu_test::Pair qkv(b, 3 * BTC, t), out(b, BTC, t), forward(b, saved.count, saved.dtype),
                rebuilt(b, saved.count, saved.dtype);
            qkv.fill(21);
            rebuilt.set(std::vector<float>(saved.count, std::numeric_limits<float>::quiet_NaN()));
            b.gpu->attention_forward(out.gpu, forward.gpu, qkv.gpu, B, T, channels, NH, drop, 5, 0,
                                     NH);
            b.gpu->attention_rebuild(rebuilt.gpu, qkv.gpu, B, T, channels, NH, drop);
            const std::vector<float> want = forward.on_gpu();
            for (float x : want) REQUIRE(std::isfinite(x));
            REQUIRE(rebuilt.on_gpu() == want);  // NaN, where not written, equals nothing
        }
    }
}

TEST_CASE("cuda: start-up chooses attention's kernels and refuses a model none can run",
          "[attention]") {
    auto gpu = make_cuda_ops(false);
    // bf16 with dropout: the flash kernels in training (cuDNN's mask is not the model's),
    // cuDNN in evaluation where it is safe.
    const std::string said = prepare_attention(*gpu, {4, 128, 256, 4, DType::bf16, 0.1f});
    INFO(said);
    REQUIRE(said.find("with attention dropout): the flash-attention kernels") != std::string::npos);
    const std::string evaluation =
        cuda::cudnn_attention_refusal(cuda::cudnn_version(), cuda::gpu_properties().major,
                                      DType::bf16, 128, 64)
                .empty()
            ? "without dropout): cuDNN fused attention"
            : "without dropout): the flash-attention kernels";
    REQUIRE(said.find(evaluation) != std::string::npos);
    // Heads of 160 elements: past the flash kernels; in fp32 cuDNN cannot take them either.
    try {
        prepare_attention(*gpu, {1, 128, 640, 4, DType::f32, 0.0f});
        FAIL("a head size of 160 in fp32 was accepted");
    } catch (const trident::Error& e) {
        INFO(e.what());
        REQUIRE(std::string(e.what()).find("heads of 1 to 128") != std::string::npos);
    }
    // ... nor with dropout in bf16.
    REQUIRE_THROWS_AS(prepare_attention(*gpu, {1, 128, 640, 4, DType::bf16, 0.1f}), trident::Error);
}

// The run's attention as the layout splits it: tensor and Ulysses' context parallelism divide
// the heads; ring attention runs its block kernels, which take heads of up to 128 elements.
TEST_CASE("cuda: start-up decides the attention of the run's layout", "[attention]") {
    // The backend's factory decides it: 8 heads of 64 over tensor 2 and Ulysses 2, each
    // rank's attention has 2 heads.
    CudaBackend backend =
        make_cuda_backend(false, {2, 128, 512, 8, 2, 2, false, DType::bf16, 0.0f, false});
    Ops* gpu = backend.ops.get();
    const std::string& ulysses = backend.attention;
    INFO(ulysses);
    REQUIRE(ulysses.find("B 2, T 128, 2 heads of 64, bf16") != std::string::npos);
    const std::string ring =
        prepare_run_attention(*gpu, {2, 128, 512, 8, 1, 2, true, DType::bf16, 0.1f, false});
    REQUIRE(ring == "attention: ring attention's block kernels over 2 ranks\n");
    try {
        prepare_run_attention(*gpu, {2, 128, 640, 4, 1, 2, true, DType::bf16, 0.0f, false});
        FAIL("ring attention with heads of 160 was accepted");
    } catch (const trident::Error& e) {
        INFO(e.what());
        REQUIRE(std::string(e.what()).find("take heads of 1 to 128 elements, not 160") !=
                std::string::npos);
    }
    // Within documents the flash kernels, where cuDNN's fused attention would take the shape.
    const std::string documents =
        prepare_run_attention(*gpu, {2, 128, 512, 8, 2, 2, false, DType::bf16, 0.0f, true});
    REQUIRE(documents.find("the flash kernels, within documents") != std::string::npos);
}
