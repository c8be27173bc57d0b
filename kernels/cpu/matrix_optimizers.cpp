// The whole-matrix optimizers' work on the CPU (kernels/ops.h has the formulas): Muon's
// momentum and step, GaLore's step, and the Newton-Schulz iterations in fp32 or with bf16's
// rounding emulated.
#include <algorithm>
#include <cstddef>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dtype.h"
#include "kernels/host_gemm.h"

namespace trident::kernels::cpu {

namespace {

// The quintic iteration's coefficients (Jordan et al. 2024).
constexpr float kA = 3.4445f, kB = -4.7750f, kC = 2.0315f;

void round_to_bf16(std::vector<float>& x) {
    for (float& e : x) e = round_to(DType::bf16, e);
}

// The iterations in fp32, each product by OpenBLAS.
void newton_schulz_fp32(float* x, int rows, int cols, int steps) {
    const std::size_t r = static_cast<std::size_t>(rows), c = static_cast<std::size_t>(cols);
    std::vector<float> current(x, x + r * c), gram(r * r), poly(r * r), next(r * c);
    for (int step = 0; step < steps; ++step) {
        host_gemm(false, true, rows, rows, cols, 1.0f, current.data(), current.data(), 0.0f,
                  gram.data());
        // poly = b·M + c·M·M
        poly = gram;
        host_gemm(false, false, rows, rows, rows, kC, gram.data(), gram.data(), kB, poly.data());
        // X ← a·X + poly·X
        next = current;
        host_gemm(false, false, rows, cols, rows, 1.0f, poly.data(), current.data(), kA,
                  next.data());
        current.swap(next);
    }
    std::copy(current.begin(), current.end(), x);
}

// The same with every GEMM's inputs bf16 values and its output rounded to bf16: the fp32
// products of bf16 inputs are exact, so an fp32 GEMM on them followed by one rounding is a
// bf16 GEMM with fp32 accumulation (up to the order of its sums).
void newton_schulz_bf16(float* x, int rows, int cols, int steps) {
    const std::size_t r = static_cast<std::size_t>(rows), c = static_cast<std::size_t>(cols);
    std::vector<float> current(x, x + r * c), gram(r * r), poly(r * r), next(r * c);
    round_to_bf16(current);
    for (int step = 0; step < steps; ++step) {
        host_gemm(false, true, rows, rows, cols, 1.0f, current.data(), current.data(), 0.0f,
                  gram.data());
        round_to_bf16(gram);
        poly = gram;
        host_gemm(false, false, rows, rows, rows, kC, gram.data(), gram.data(), kB, poly.data());
        round_to_bf16(poly);
        next = current;
        host_gemm(false, false, rows, cols, rows, 1.0f, poly.data(), current.data(), kA,
                  next.data());
        round_to_bf16(next);
        current.swap(next);
    }
    std::copy(current.begin(), current.end(), x);
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

void newton_schulz(float* x, int rows, int cols, int steps, bool bf16) {
    if (bf16)
        newton_schulz_bf16(x, rows, cols, steps);
    else
        newton_schulz_fp32(x, rows, cols, steps);
}

}  // namespace trident::kernels::cpu
