// The whole-matrix optimizers' work on the CPU (kernels/ops.h has the formulas): Muon's
// momentum and step, GaLore's step, and the Newton-Schulz iterations in fp32 or with bf16's
// rounding emulated.
#include <algorithm>
#include <cstddef>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dtype.h"
#include "kernels/host_gemm.h"

namespace trident::kernels::cpu {

namespace {

// The quintic iteration's coefficients (Jordan et al. 2024).
constexpr float kA = 3.4445f, kB = -4.7750f, kC = 2.0315f;

// x[0, n) rounded to bf16 in place when `bf16`; fp32: left as it is.
void round_if(bool bf16, float* x, std::size_t n) {
    if (!bf16) return;
    for (std::size_t i = 0; i < n; ++i) x[i] = round_to(DType::bf16, x[i]);
}

}  // namespace

void muon_momentum(float* u, float* momentum, const float* grads, std::size_t count, float mu,
                   bool nesterov, float grad_scale) {
#pragma omp parallel for schedule(static)
    for (std::size_t i = 0; i < count; ++i) {
        const float g = grads[i] * grad_scale;
        momentum[i] = mu * momentum[i] + g;
        u[i] = nesterov ? g + mu * momentum[i] : momentum[i];
    }
}

void muon_update(float* master, const float* direction, std::size_t count, float lr,
                 float weight_decay) {
#pragma omp parallel for schedule(static)
    for (std::size_t i = 0; i < count; ++i) {
        const float w = master[i];
        master[i] = w - lr * weight_decay * w - lr * direction[i];
    }
}

void galore_update(float* master, const float* direction, std::size_t count, float lr,
                   float weight_decay) {
#pragma omp parallel for schedule(static)
    for (std::size_t i = 0; i < count; ++i) {
        const float w = master[i] - direction[i];
        master[i] = w - lr * weight_decay * w;
    }
}

// The iterations in fp32, each product by OpenBLAS; with `bf16`, every GEMM's inputs bf16
// values and its output rounded to bf16: the fp32 products of bf16 inputs are exact, so an
// fp32 GEMM on them followed by one rounding is a bf16 GEMM with fp32 accumulation (up to the
// order of its sums). X alternates between x and the scratch's first (rows, cols).
void newton_schulz(float* x, float* scratch, int rows, int cols, int steps, bool bf16) {
    const std::size_t wide = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
    const std::size_t square = static_cast<std::size_t>(rows) * static_cast<std::size_t>(rows);
    float* current = x;
    float* next = scratch;
    float* gram = scratch + wide;
    float* poly = gram + square;
    round_if(bf16, current, wide);
    for (int step = 0; step < steps; ++step) {
        host_gemm(false, true, rows, rows, cols, 1.0f, current, current, 0.0f, gram);
        round_if(bf16, gram, square);
        // poly = b·M + c·M·M
        std::copy(gram, gram + square, poly);
        host_gemm(false, false, rows, rows, rows, kC, gram, gram, kB, poly);
        round_if(bf16, poly, square);
        // X ← a·X + poly·X
        std::copy(current, current + wide, next);
        host_gemm(false, false, rows, cols, rows, 1.0f, poly, current, kA, next);
        round_if(bf16, next, wide);
        std::swap(current, next);
    }
    if (current != x) std::copy(current, current + wide, x);
}

}  // namespace trident::kernels::cpu
