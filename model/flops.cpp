// GEMM FLOPs per microbatch (see flops.h).
#include "model/flops.h"

#include "model/param_layout.h"

namespace trident::model {

namespace {

// A linear's widths on this rank: a column split's output rows (whole key/value heads kept
// together, model/param_layout.h), a row split's input columns.
double local_in(const LinearDecl& w, const Dims& d) {
    return w.split.kind == SplitKind::row ? static_cast<double>(w.in / d.M)
                                          : static_cast<double>(w.in);
}

double local_out(const LinearDecl& w, const Dims& d) {
    if (w.split.kind != SplitKind::column) return static_cast<double>(w.out);
    const int replicas = w.split.groups > 0 ? kv_replicas(w.split.groups, d.M) : 1;
    return static_cast<double>(w.out / (d.M / replicas));
}

}  // namespace

GemmFlops gemm_flops(const ModelSpec& spec, const Dims& d, Recompute recompute, int l,
                     double attended) {
    const double N = d.N, H = d.H, Hm = d.Hm, T = d.T, B = d.B;
    const double V = static_cast<double>(d.Vm);
    // Every linear of the layer (q, k and v, the projection, the MLP's), the last the MLP's
    // output, and the two attention products (causal: half of 4·B·T²·H/M).
    double linears = 0, last = 0;
    for (const LinearDecl& w : spec.layer_linears(l)) {
        last = 2 * N * local_in(w, d) * local_out(w, d);
        linears += last;
    }
    const double scores = B * T * T * d.C * Hm * attended;  // Q·Kᵀ, causal half, whole keys
    GemmFlops f;
    f.layer_forward = linears + 2 * scores;
    double rerun = 0;
    if (recompute == Recompute::full) rerun = f.layer_forward - last;
    if (recompute == Recompute::selective) rerun = scores;
    f.layer_backward = 2 * f.layer_forward + rerun;
    f.layer_weight = f.layer_forward - 2 * scores;  // one GEMM per linear, none for attention
    f.head_forward = 2 * N * H * V;
    f.head_backward = 4 * N * H * V;
    f.head_weight = 2 * N * H * V;
    return f;
}

}  // namespace trident::model
