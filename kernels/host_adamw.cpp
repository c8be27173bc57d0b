// AdamW's element loop on host memory (see host_adamw.h).
#include "kernels/host_adamw.h"

#include <cmath>

namespace trident::kernels {

AdamwFactors::AdamwFactors(float lr, float beta1_, float beta2_, float eps_, float weight_decay,
                           int step) {
    const double bias_correction1 = 1.0 - std::pow(static_cast<double>(beta1_), step);
    const double bias_correction2 = 1.0 - std::pow(static_cast<double>(beta2_), step);
    step_size = static_cast<float>(lr / bias_correction1);
    bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
    decay = static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay);
    one_minus_beta1 = static_cast<float>(1.0 - beta1_);
    one_minus_beta2 = static_cast<float>(1.0 - beta2_);
    beta2 = beta2_;
    eps = eps_;
}

// The loop is memory-bound; GCC vectorises it only under -fno-math-errno (std::sqrt may set
// errno), which makes it about 3x faster.
void adamw_elements(const AdamwFactors& f, float* params, const float* grads, float* m, float* v,
                    std::size_t begin, std::size_t end, float grad_scale, float* params_out) {
#pragma omp simd
    for (std::size_t i = begin; i < end; i++) {
        const float g = grads[i] * grad_scale;
        const float m_i = m[i] + f.one_minus_beta1 * (g - m[i]);
        const float v_i = f.beta2 * v[i] + f.one_minus_beta2 * g * g;
        const float denom = std::sqrt(v_i) / f.bias_correction2_sqrt + f.eps;
        const float p = params[i] * f.decay - f.step_size * m_i / denom;
        params[i] = p;
        if (params_out) params_out[i] = p;
        m[i] = m_i;
        v[i] = v_i;
    }
}

}  // namespace trident::kernels
