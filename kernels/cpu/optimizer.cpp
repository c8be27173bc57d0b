// The optimizer's elementwise work: the squared norm for gradient clipping, scaling, and
// the AdamW step.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace trident::kernels::cpu {

// sum x^2 in double. The range is cut into fixed chunks whose partial sums are added in
// chunk order, so the result does not depend on the thread count or on scheduling (an OpenMP
// reduction clause combines its partials in an unspecified order).
double sum_of_squares(const float* x, std::size_t count) {
    constexpr std::size_t kChunk = std::size_t{1} << 16;
    const std::size_t chunks = (count + kChunk - 1) / kChunk;
    std::vector<double> partial(chunks);  // (chunks)
#pragma omp parallel for schedule(static)
    for (std::size_t chunk = 0; chunk < chunks; chunk++) {
        const std::size_t begin = chunk * kChunk;
        const std::size_t end = std::min(begin + kChunk, count);
        double sum = 0.0;
#pragma omp simd reduction(+ : sum)
        for (std::size_t i = begin; i < end; i++) sum += static_cast<double>(x[i]) * x[i];
        partial[chunk] = sum;
    }
    double total = 0.0;
    for (double p : partial) total += p;
    return total;
}

// x *= factor
void scale(float* x, std::size_t count, float factor) {
#pragma omp parallel for simd schedule(static)
    for (std::size_t i = 0; i < count; i++) x[i] *= factor;
}

// One torch.optim.AdamW step (single-tensor path) on g = grads * grad_scale, operation for
// operation up to the compiler's fused multiply-adds:
//   param *= 1 - lr*wd;  m = lerp(m, g, 1-beta1);  v = beta2 v + (1-beta2) g^2
//   param -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps),  bc_i = 1 - beta_i^step.
// The bias corrections are computed in double, as Python does, then rounded once.
// The updated params are also written to params_out (the model's working copy) unless it is
// null. The loop is memory-bound; GCC vectorises it only under -fno-math-errno (std::sqrt may
// set errno), which makes it about 3x faster.
void adamw_update(float* params, const float* grads, float* m, float* v, std::size_t count,
                  float lr, float beta1, float beta2, float eps, float weight_decay, int step,
                  float grad_scale, float* params_out) {
    const double bias_correction1 = 1.0 - std::pow(static_cast<double>(beta1), step);
    const double bias_correction2 = 1.0 - std::pow(static_cast<double>(beta2), step);
    const float step_size = static_cast<float>(lr / bias_correction1);
    const float bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
    const float decay = static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay);
    const float one_minus_beta1 = static_cast<float>(1.0 - beta1);
    const float one_minus_beta2 = static_cast<float>(1.0 - beta2);
#pragma omp parallel for simd schedule(static)
    for (std::size_t i = 0; i < count; i++) {
        const float g = grads[i] * grad_scale;
        const float m_i = m[i] + one_minus_beta1 * (g - m[i]);
        const float v_i = beta2 * v[i] + one_minus_beta2 * g * g;
        const float denom = std::sqrt(v_i) / bias_correction2_sqrt + eps;
        const float p = params[i] * decay - step_size * m_i / denom;
        params[i] = p;
        if (params_out) params_out[i] = p;
        m[i] = m_i;
        v[i] = v_i;
    }
}

}  // namespace trident::kernels::cpu
