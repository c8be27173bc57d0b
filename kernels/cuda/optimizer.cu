// The optimizer's elementwise work on device buffers: the squared norm for clipping and the
// overflow check, and the AdamW step on fp32 master weights.
#include <cmath>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/elements.cuh"

namespace trident::kernels::cuda {

namespace {

// The number of partial sums is fixed, not taken from the device: the same buffer gives the
// same double on any GPU.
constexpr int kPartials = 512;
constexpr int kThreads = 256;

// partial[b] = sum of x^2 over the b-th of kPartials equal ranges, in double.
template <typename E>
__global__ void squares_partials_kernel(double* partial, const E* x, std::size_t count) {
    __shared__ double shared[32];
    const std::size_t chunk = (count + kPartials - 1) / kPartials;
    const std::size_t begin = blockIdx.x * chunk;
    const std::size_t end = begin + chunk < count ? begin + chunk : count;
    double sum = 0.0;
    for (std::size_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
        const double v = to_float(x[i]);
        sum += v * v;
    }
    sum = block_sum(sum, shared);
    if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// One block of kPartials threads adds the partials, then their sum to *total: inf or NaN
// anywhere stays in the total.
__global__ void squares_total_kernel(double* total, const double* partial) {
    __shared__ double shared[32];
    const double sum = block_sum(partial[threadIdx.x], shared);
    if (threadIdx.x == 0) *total += sum;
}

// torch.optim.AdamW (single-tensor path) on g = grads * grad_scale, as the CPU backend:
//   master *= 1 - lr*wd;  m = lerp(m, g, 1-beta1);  v = beta2 v + (1-beta2) g^2
//   master -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps);  params = master, rounded.
struct AdamWStep {
    float step_size, bias_correction2_sqrt, decay, beta2, one_minus_beta1, one_minus_beta2, eps,
        grad_scale;
};

template <typename G, typename P>
__global__ void adamw_kernel(float* master, const G* grads, float* m, float* v, std::size_t count,
                             AdamWStep s, P* params) {
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
         i += stride) {
        const float g = to_float(grads[i]) * s.grad_scale;
        const float m_i = m[i] + s.one_minus_beta1 * (g - m[i]);
        const float v_i = s.beta2 * v[i] + s.one_minus_beta2 * g * g;
        const float denom = sqrtf(v_i) / s.bias_correction2_sqrt + s.eps;
        const float w = master[i] * s.decay - s.step_size * m_i / denom;
        master[i] = w;
        m[i] = m_i;
        v[i] = v_i;
        if (params != nullptr) params[i] = from_float<P>(w);
    }
}

}  // namespace

std::size_t sum_of_squares_scratch() {
    return kPartials;
}

template <typename E>
void add_sum_of_squares(double* total, double* scratch, const E* x, std::size_t count,
                        cudaStream_t stream) {
    squares_partials_kernel<<<kPartials, kThreads, 0, stream>>>(scratch, x, count);
    TRIDENT_CUDA_CHECK_LAUNCH();
    squares_total_kernel<<<1, kPartials, 0, stream>>>(total, scratch);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

template <typename G, typename P>
void adamw_update(float* master, const G* grads, float* m, float* v, std::size_t count, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int step,
                  float grad_scale, P* params, cudaStream_t stream) {
    if (count == 0) return;
    // The bias corrections in double, as Python computes them, then rounded once.
    const double bias_correction1 = 1.0 - std::pow(static_cast<double>(beta1), step);
    const double bias_correction2 = 1.0 - std::pow(static_cast<double>(beta2), step);
    const AdamWStep s{static_cast<float>(lr / bias_correction1),
                      static_cast<float>(std::sqrt(bias_correction2)),
                      static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay),
                      beta2,
                      static_cast<float>(1.0 - beta1),
                      static_cast<float>(1.0 - beta2),
                      eps,
                      grad_scale};
    adamw_kernel<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(master, grads, m, v, count,
                                                                       s, params);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

#define TRIDENT_INSTANTIATE_ADAMW(G, P)                                                           \
    template void adamw_update<G, P>(float*, const G*, float*, float*, std::size_t, float, float, \
                                     float, float, float, int, float, P*, cudaStream_t);
#define TRIDENT_INSTANTIATE(E)                                                                  \
    template void add_sum_of_squares<E>(double*, double*, const E*, std::size_t, cudaStream_t); \
    TRIDENT_INSTANTIATE_ADAMW(E, float)                                                         \
    TRIDENT_INSTANTIATE_ADAMW(E, __nv_bfloat16)                                                 \
    TRIDENT_INSTANTIATE_ADAMW(E, __half)
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(__nv_bfloat16)
TRIDENT_INSTANTIATE(__half)
#undef TRIDENT_INSTANTIATE
#undef TRIDENT_INSTANTIATE_ADAMW

}  // namespace trident::kernels::cuda
