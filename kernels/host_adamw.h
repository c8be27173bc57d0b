// AdamW's element loop on host memory, run by the CPU backend's adamw_update kernel and by
// the host-side Adam of optimizer.offload: host (src/optim/adamw_host.cpp), so that both
// compute the same bits: one compiled loop, whatever thread runs which slice of it.
#pragma once

#include <cstddef>

namespace trident::kernels {

// One torch.optim.AdamW step's factors (single-tensor path), for step `step` (1-based):
//   param *= 1 - lr*wd;  m = lerp(m, g, 1-beta1);  v = beta2 v + (1-beta2) g^2
//   param -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps),  bc_i = 1 - beta_i^step.
// The bias corrections are computed in double, as Python does, then rounded once.
struct AdamwFactors {
    AdamwFactors(float lr, float beta1, float beta2, float eps, float weight_decay, int step);
    float step_size, bias_correction2_sqrt, decay, one_minus_beta1, one_minus_beta2, beta2, eps;
};

// Elements [begin, end) of one step on g = grads * grad_scale, operation for operation up to
// the compiler's fused multiply-adds. The updated params are also written to params_out
// unless it is null. Serial: callers split the elements over their threads.
void adamw_elements(const AdamwFactors& f, float* params, const float* grads, float* m, float* v,
                    std::size_t begin, std::size_t end, float grad_scale, float* params_out);

}  // namespace trident::kernels
