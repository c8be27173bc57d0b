// The optimizer's elementwise work: the squared norm for gradient clipping, scaling, and
// the AdamW step.
#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/host_adamw.h"

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

// One torch.optim.AdamW step (kernels/host_adamw.h has the formula), its elements split
// evenly over the threads.
void adamw_update(float* params, const float* grads, float* m, float* v, std::size_t count,
                  float lr, float beta1, float beta2, float eps, float weight_decay, int step,
                  float grad_scale, float* params_out) {
    const AdamwFactors factors(lr, beta1, beta2, eps, weight_decay, step);
#pragma omp parallel
    {
        const std::size_t threads = static_cast<std::size_t>(omp_get_num_threads());
        const std::size_t piece = (count + threads - 1) / threads;
        const std::size_t begin =
            std::min(count, piece * static_cast<std::size_t>(omp_get_thread_num()));
        adamw_elements(factors, params, grads, m, v, begin, std::min(count, begin + piece),
                       grad_scale, params_out);
    }
}

}  // namespace trident::kernels::cpu
