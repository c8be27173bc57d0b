// GEMM FLOPs per microbatch (see flops.h).
#include "model/flops.h"

namespace trident::model {

GemmFlops gemm_flops(const Dims& d, Recompute recompute) {
    const double N = d.N, H = d.H, Hm = d.Hm, Fm = d.Fm, T = d.T, B = d.B;
    const double V = static_cast<double>(d.Vm);
    // q, k and v (grouped-query attention: KVm = kv_heads·d columns each for k and v), the
    // projection, the MLP's input linears (fc, or SwiGLU's gate and up) and its output one,
    // and the two attention products (causal: half of 4·B·T²·H/M).
    const double qkv_out = Hm + 2.0 * d.kv_heads * (Hm / d.heads);
    const double mlp_in = d.gated ? 2 * Fm : Fm;
    const double fc_proj = 2 * N * Fm * H;
    const double scores = B * T * T * d.context_size * Hm;  // Q·Kᵀ, causal half, whole keys
    GemmFlops f;
    f.layer_forward =
        2 * N * H * qkv_out + 2 * N * Hm * H + 2 * N * H * mlp_in + fc_proj + 2 * scores;
    double rerun = 0;
    if (recompute == Recompute::full) rerun = f.layer_forward - fc_proj;
    if (recompute == Recompute::selective) rerun = scores;
    f.layer_backward = 2 * f.layer_forward + rerun;
    f.layer_weight = f.layer_forward - 2 * scores;  // one GEMM per linear, none for attention
    f.head_forward = 2 * N * H * V;
    f.head_backward = 4 * N * H * V;
    f.head_weight = 2 * N * H * V;
    return f;
}

}  // namespace trident::model
