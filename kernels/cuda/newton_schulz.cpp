// Muon's Newton-Schulz iterations on the GPU (see newton_schulz.h).
#include "kernels/cuda/newton_schulz.h"

#include <cuda_bf16.h>

#include <string>
#include <utility>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/error.h"

namespace trident::kernels::cuda {

namespace {

// The quintic iteration's coefficients (Jordan et al. 2024), as the CPU's.
constexpr float kA = 3.4445f, kB = -4.7750f, kC = 2.0315f;

// D (rows, cols) = alpha·A (rows, inner) @ B' (inner, cols) + beta·D; B' is B or, with
// trans_b, Bᵀ of B stored (cols, inner).
GemmCall product(int rows, int cols, int inner, ConstPtr a, ConstPtr b, bool trans_b, Ptr d,
                 float alpha, float beta) {
    GemmCall call;
    call.rows = rows;
    call.cols = cols;
    call.inner = inner;
    call.a = a;
    call.b = b;
    call.trans_b = trans_b;
    call.d = d;
    call.alpha = alpha;
    call.beta = beta;
    return call;
}

}  // namespace

void NewtonSchulz::run(float* x, float* scratch, int rows, int cols, int steps, DType precision) {
    if (precision != DType::f32 && precision != DType::bf16)
        throw Error(std::string("internal: Newton-Schulz iterations in ") + name_of(precision));
    if (!gemm_) gemm_ = std::make_unique<Gemm>(allocator_, false);
    const std::size_t wide = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
    const std::size_t square = static_cast<std::size_t>(rows) * static_cast<std::size_t>(rows);
    const std::size_t bytes = size_of(precision);
    const bool bf16 = precision == DType::bf16;
    // X alternates between x and the scratch's first (rows, cols), M and P follow it: fp32,
    // from x; bf16 (its arrays in the first half of each place), from the scratch, x's bytes
    // being free once it is read.
    void* current = bf16 ? static_cast<void*>(scratch) : static_cast<void*>(x);
    void* next = bf16 ? static_cast<void*>(x) : static_cast<void*>(scratch);
    void* gram = scratch + wide;
    void* poly = scratch + wide + square;
    const auto typed = [&](void* p) { return Ptr(p, precision); };
    if (bf16) convert(static_cast<__nv_bfloat16*>(current), x, wide, stream_);
    for (int step = 0; step < steps; ++step) {
        // M = X·Xᵀ
        gemm_->run(product(rows, rows, cols, typed(current), typed(current), true, typed(gram),
                           1.0f, 0.0f),
                   stream_);
        // P = c·M·M + b·M
        TRIDENT_CUDA_CHECK(
            cudaMemcpyAsync(poly, gram, square * bytes, cudaMemcpyDeviceToDevice, stream_));
        gemm_->run(product(rows, rows, rows, typed(gram), typed(gram), false, typed(poly), kC, kB),
                   stream_);
        // X ← P·X + a·X
        TRIDENT_CUDA_CHECK(
            cudaMemcpyAsync(next, current, wide * bytes, cudaMemcpyDeviceToDevice, stream_));
        gemm_->run(
            product(rows, cols, rows, typed(poly), typed(current), false, typed(next), 1.0f, kA),
            stream_);
        std::swap(current, next);
    }
    if (current == x && bf16)  // out of x's bytes before they are widened in place
        TRIDENT_CUDA_CHECK(
            cudaMemcpyAsync(scratch, x, wide * bytes, cudaMemcpyDeviceToDevice, stream_));
    if (bf16)
        convert(x, reinterpret_cast<const __nv_bfloat16*>(scratch), wide, stream_);
    else if (current != x)
        TRIDENT_CUDA_CHECK(
            cudaMemcpyAsync(x, current, wide * bytes, cudaMemcpyDeviceToDevice, stream_));
}

}  // namespace trident::kernels::cuda
