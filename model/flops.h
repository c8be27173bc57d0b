// The GEMM FLOPs one rank executes for one microbatch, counted from the linears a layer's parts
// declare (model/tensor_decl.h) at the sizes every part uses (model/dims.h): a layer's forward
// and backward (what recompute reruns included: full reruns the forward up to the MLP's last
// linear, selective the attention scores), and the LM head's (logits (N, Vm) and their
// gradients). Causal attention counts at half, as kernels that skip the masked blocks run it.
// The pipeline's stage cuts balance these (src/config/stage_cuts.h) and the planner's step-time
// model adds them up (src/plan/perf_model.h).
#pragma once

#include "model/buffer_spec.h"
#include "model/dims.h"
#include "model/model_spec.h"

namespace trident::model {

struct GemmFlops {
    double layer_forward = 0, layer_backward = 0;
    double head_forward = 0, head_backward = 0;
    // Of the backwards, the weight gradients' GEMMs (a split backward's W).
    double layer_weight = 0, head_weight = 0;
};

// The FLOPs of layer `l` of `spec` (every layer's, while they are alike) and of the head;
// `attended`: the fraction of a causal window's attention scores computed (packed documents of
// mean length L in windows of S tokens: L/S, docs/FORMULAS.md).
GemmFlops gemm_flops(const ModelSpec& spec, const Dims& d, Recompute recompute, int l = 0,
                     double attended = 1);

}  // namespace trident::model
