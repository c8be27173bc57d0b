// A pre-norm transformer layer on this rank's rows of the residual stream (R, H):
//   x2 = x + dropout(attention(norm1(x))),  out = x2 + dropout(feed_forward(norm2(x2))).
// It is assembled from parts (model/norm.h, model/self_attention.h, model/mlp.h), which declare
// its buffers (model/buffer_spec.h) and own their parameters' offsets; the layer itself owns
// only the residual stream between them. A layer of another kind is other parts
// (docs/ARCHITECTURE.md, "How to add a layer kind").
#pragma once

#include <memory>

#include "model/mlp.h"
#include "model/norm.h"
#include "model/self_attention.h"  // Attention

namespace trident::model {

class TransformerLayer {
public:
    struct Parts {
        std::unique_ptr<Norm> norm1;
        std::unique_ptr<Attention> attention;
        std::unique_ptr<Norm> norm2;
        std::unique_ptr<FeedForward> feed_forward;
    };
    // `spec`: the buffers the parts declared, to which the layer adds its own.
    TransformerLayer(SetSpec spec, Parts parts, float dropout, const Dims& d, ScratchSpec& scratch);

    const SetSpec& spec() const { return spec_; }
    // The layer's output (R, H) in the set: the next layer's input.
    kernels::Ptr output(const Pass& pass) const { return pass.buffers[output_]; }

    // From this rank's rows x (R, H) into `output`; a null output stops where the backward
    // needs no more (full recompute's rerun).
    void forward(PartContext& ctx, const Pass& pass, kernels::ConstPtr x,
                 kernels::Ptr output) const;
    // d_residual (R, H), the gradient of the layer's output, becomes its input's. `rebuild`:
    // selective recompute dropped what attention keeps. `defer_attention` (a plain backward
    // only): the attention's weight gradients are left for attention_weights, what they read
    // kept as a split backward's B keeps it.
    void backward(PartContext& ctx, const Pass& pass, kernels::ConstPtr x, kernels::Ptr d_residual,
                  BackwardPart part, bool rebuild, bool defer_attention = false) const;
    void backward_weight(PartContext& ctx, const Pass& pass, kernels::ConstPtr x) const;
    // The attention's weight gradients a backward deferred.
    void attention_weights(PartContext& ctx, const Pass& pass) const;
    // Whether its MLP's backward exchanges rows over the expert group (model/mlp.h).
    bool exchanges() const { return parts_.feed_forward->exchanges(); }
    // After the step's last backward: the partial sums of the norms (sequence parallelism) and
    // of the adapters' whole factors summed over the tensor group.
    void finish_grads(PartContext& ctx) const;

private:
    SetSpec spec_;
    Parts parts_;
    float dropout_;
    int residual2_, output_;  // slots: x2 and the output (R, H)
    int d_rows_;              // scratch: a gradient through dropout (R, H)
};

}  // namespace trident::model
