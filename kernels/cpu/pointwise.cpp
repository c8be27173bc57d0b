// Elementwise ops: GELU (tanh form), SwiGLU, the residual add, ReLU, the product, and inverted
// dropout. Each element is independent, so the loops are split over threads and vectorised.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ops.h"

namespace trident::kernels::cpu {

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;
}  // namespace

// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
void gelu_forward(float* out, const float* inp, std::size_t count) {
#pragma omp parallel for simd schedule(static)
    for (std::size_t i = 0; i < count; i++) {
        const float x = inp[i];
        const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
        out[i] = 0.5f * x * (1.0f + fast_tanh(u));
    }
}

// dinp += dout * d/dx gelu(x)
//       = dout * (0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 x^2))
void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t count) {
#pragma omp parallel for simd schedule(static)
    for (std::size_t i = 0; i < count; i++) {
        const float x = inp[i];
        const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
        const float th = fast_tanh(u);
        const float du_dx = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
        const float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du_dx;
        dinp[i] += dout[i] * grad;
    }
}

// SwiGLU (Shazeer 2020), the input of Llama's down projection: out (N,F) = silu(gate) * up,
// inp (N,2F) holding each row's gate then up (the fused gate and up linears' output).
void swiglu_forward(float* out, const float* inp, int N, int F) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* g = inp + static_cast<std::size_t>(n) * 2 * F;
        const float* u = g + F;
        float* y = out + static_cast<std::size_t>(n) * F;
        for (int i = 0; i < F; i++) y[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    }
}

// dinp (N,2F) += the gradients of gate and up: with s = sigmoid(g),
//   dgate = dout * u * s * (1 + g (1 - s)),  dup = dout * g * s.
void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* g = inp + static_cast<std::size_t>(n) * 2 * F;
        const float* u = g + F;
        const float* dy = dout + static_cast<std::size_t>(n) * F;
        float* dg = dinp + static_cast<std::size_t>(n) * 2 * F;
        float* du = dg + F;
        for (int i = 0; i < F; i++) {
            const float s = 1.0f / (1.0f + std::exp(-g[i]));
            dg[i] += dy[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
            du[i] += dy[i] * g[i] * s;
        }
    }
}

// out = a + b
void residual_forward(float* out, const float* a, const float* b, std::size_t count) {
#pragma omp parallel for simd schedule(static)
    for (std::size_t i = 0; i < count; i++) out[i] = a[i] + b[i];
}

// out = max(x, 0)
void relu_forward(float* out, const float* inp, std::size_t count) {
#pragma omp parallel for simd schedule(static)
    for (std::size_t i = 0; i < count; i++) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

// out = a * b * factor
void multiply(float* out, const float* a, const float* b, std::size_t count, float factor) {
#pragma omp parallel for simd schedule(static)
    for (std::size_t i = 0; i < count; i++) out[i] = a[i] * b[i] * factor;
}

// out (rows, cols) = inp with row i times factors[i]
void scale_rows(float* out, const float* inp, const float* factors, std::size_t rows,
                std::size_t cols) {
#pragma omp parallel for schedule(static)
    for (std::size_t i = 0; i < rows; i++)
        for (std::size_t j = 0; j < cols; j++) out[i * cols + j] = inp[i * cols + j] * factors[i];
}

// out = inp / (1-p) where dropout_keep(seed, index_begin + i, p), else 0. A select rather
// than a multiply by a 0/1 mask, so p = 1 gives zeros instead of 0 * inf. index_begin is the
// global index of element 0, so a rank holding a share of the rows draws their mask.
void dropout_forward(float* out, const float* inp, std::size_t count, float drop_prob,
                     uint64_t seed, uint64_t index_begin) {
    const float keep_scale = 1.0f / (1.0f - drop_prob);
#pragma omp parallel for simd schedule(static)
    for (std::size_t i = 0; i < count; i++) {
        out[i] = dropout_keep(seed, index_begin + i, drop_prob) ? inp[i] * keep_scale : 0.0f;
    }
}

// dinp += dout / (1-p) where the forward kept the element; the mask is recomputed.
void dropout_backward(float* dinp, const float* dout, std::size_t count, float drop_prob,
                      uint64_t seed, uint64_t index_begin) {
    const float keep_scale = 1.0f / (1.0f - drop_prob);
#pragma omp parallel for simd schedule(static)
    for (std::size_t i = 0; i < count; i++) {
        if (dropout_keep(seed, index_begin + i, drop_prob)) dinp[i] += dout[i] * keep_scale;
    }
}

}  // namespace trident::kernels::cpu
