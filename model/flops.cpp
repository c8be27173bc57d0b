// GEMM FLOPs per microbatch (see flops.h).
#include "model/flops.h"

#include "model/param_layout.h"

namespace trident::model {

namespace {

// A weight's widths on this rank: a column split's output rows (whole key/value heads kept
// together, model/param_layout.h), a row split's input columns.
double local_in(int64_t in, const Split& split, const Dims& d) {
    return split.kind == SplitKind::row ? static_cast<double>(in / d.M) : static_cast<double>(in);
}

double local_out(int64_t out, const Split& split, const Dims& d) {
    if (split.kind != SplitKind::column) return static_cast<double>(out);
    const int replicas = split.groups > 0 ? kv_replicas(split.groups, d.M) : 1;
    return static_cast<double>(out / (d.M / replicas));
}

}  // namespace

GemmFlops gemm_flops(const ModelSpec& spec, const Dims& d, Recompute recompute, int l,
                     double attended) {
    const double N = d.N, H = d.H, Hm = d.Hm, T = d.T, B = d.B;
    const double V = static_cast<double>(d.Vm);
    // Every linear of the layer (q, k and v, the projection, the MLP's), the last the MLP's
    // output; the other GEMMs on their share of the tokens (a router, routed experts: top_k of
    // the N experts' per token); and the two attention products (causal: half of 4·B·T²·H/M).
    double linears = 0, last = 0;
    for (const LinearDecl& w : spec.layer_linears(l)) {
        last = 2 * N * local_in(w.in, w.split, d) * local_out(w.out, w.split, d);
        linears += last;
    }
    for (const GemmDecl& g : spec.layer_gemms(l))
        linears += 2 * N * g.share * local_in(g.in, g.split, d) * local_out(g.out, g.split, d);
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
