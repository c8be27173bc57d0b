// The whole-matrix optimizers' element work on device buffers (kernels/ops.h has the formulas):
// Muon's momentum and its step along the direction, and GaLore's step along its direction.
// All fp32 but the gradients (any type) and the rounded copy of the weights (any type).
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/elements.cuh"

namespace trident::kernels::cuda {

namespace {

constexpr int kThreads = 256;

// g = grads * grad_scale; momentum = mu·momentum + g; u = g + mu·momentum or momentum.
template <typename G>
__global__ void muon_momentum_kernel(float* u, float* momentum, const G* grads, std::size_t count,
                                     float mu, bool nesterov, float grad_scale) {
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
         i += stride) {
        const float g = to_float(grads[i]) * grad_scale;
        const float m = mu * momentum[i] + g;
        momentum[i] = m;
        u[i] = nesterov ? g + mu * m : m;
    }
}

// Muon: master = w − lr·wd·w − lr·direction. GaLore (decay_after): w = master − direction,
// master = w − lr·wd·w. params = master, rounded, unless null.
template <typename P>
__global__ void matrix_update_kernel(float* master, const float* direction, std::size_t count,
                                     float lr, float lr_decay, bool decay_after, P* params) {
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
         i += stride) {
        float w = master[i];
        if (decay_after) {
            w -= direction[i];
            w -= lr_decay * w;
        } else {
            w = w - lr_decay * w - lr * direction[i];
        }
        master[i] = w;
        if (params != nullptr) params[i] = from_float<P>(w);
    }
}

}  // namespace

template <typename G>
void muon_momentum(float* u, float* momentum, const G* grads, std::size_t count, float mu,
                   bool nesterov, float grad_scale, cudaStream_t stream) {
    if (count == 0) return;
    muon_momentum_kernel<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(
        u, momentum, grads, count, mu, nesterov, grad_scale);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

template <typename P>
void matrix_update(float* master, const float* direction, std::size_t count, float lr,
                   float weight_decay, bool decay_after, P* params, cudaStream_t stream) {
    if (count == 0) return;
    matrix_update_kernel<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(
        master, direction, count, lr, lr * weight_decay, decay_after, params);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

#define TRIDENT_INSTANTIATE(E)                                                                \
    template void muon_momentum<E>(float*, float*, const E*, std::size_t, float, bool, float, \
                                   cudaStream_t);                                             \
    template void matrix_update<E>(float*, const float*, std::size_t, float, float, bool, E*, \
                                   cudaStream_t);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(__nv_bfloat16)
TRIDENT_INSTANTIATE(__half)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::kernels::cuda
