// A layer's feed-forward sublayer. GPT-2's: the column-split fc linear (H -> F, its columns
// split over the tensor group), GELU (tanh form), the row-split fc_proj linear (F -> H), whose
// partial outputs the tensor group reduces.
//
// Shapes (this rank): input x (R, H) = the norm's output; fc's output and the GELU's (N, Fm)
// kept for the backward; output (R, H), with fc_proj's bias.
//
// Llama's (MlpActivation::swiglu): the gate and up linears, column-split and run as one (H -> 2F,
// their weights adjacent), SwiGLU down's input silu(gate)·up, the row-split down linear (F -> H).
// Shapes (this rank): gate and up's output (N, 2Fm) and SwiGLU's (N, Fm) kept for the
// backward.
//
// A feed-forward sublayer is one kind of part (docs/ARCHITECTURE.md, "How to add a layer
// kind"): each is an implementation of FeedForward.
#pragma once

#include "model/linear.h"

namespace trident::model {

class FeedForward {
public:
    virtual ~FeedForward() = default;
    // This rank's rows of the output (R, H), in the scratch; with `to_output` false (full
    // recompute's rerun) only what the backward reads, and null.
    virtual kernels::Ptr forward(PartContext& ctx, const Pass& pass, kernels::ConstPtr x,
                                 bool to_output) const = 0;
    // This rank's rows of the input's gradient (R, H), in the scratch, from dy (R, H).
    virtual kernels::ConstPtr backward(PartContext& ctx, const Pass& pass, kernels::ConstPtr x,
                                       kernels::ConstPtr dy, BackwardPart part) const = 0;
    virtual void backward_weight(PartContext& ctx, const Pass& pass, kernels::ConstPtr x) const = 0;
    virtual void finish_grads(PartContext& ctx) const = 0;
};

// The activation between an MLP's two linears: GELU (tanh form) on fc's output (N, Fm), or
// SwiGLU, silu(gate)·up, on the fused gate and up linear's output (N, 2Fm).
enum class MlpActivation { gelu, swiglu };

// GPT-2's and Llama's MLP: the column-split input linear, the activation, the row-split
// output linear.
class Mlp final : public FeedForward {
public:
    // `in`: H -> Fm (gelu) or H -> 2Fm (swiglu: gate then up); `out`: Fm -> H.
    Mlp(MlpActivation activation, const LinearSpec& in, const LinearSpec& out, const Dims& d,
        SetSpec& set, ScratchSpec& scratch);

    kernels::Ptr forward(PartContext& ctx, const Pass& pass, kernels::ConstPtr x,
                         bool to_output) const override;
    kernels::ConstPtr backward(PartContext& ctx, const Pass& pass, kernels::ConstPtr x,
                               kernels::ConstPtr dy, BackwardPart part) const override;
    void backward_weight(PartContext& ctx, const Pass& pass, kernels::ConstPtr x) const override;
    void finish_grads(PartContext& ctx) const override;

private:
    MlpActivation activation_;
    Linear in_, out_;
    int in_out_, activated_;  // slots: the input linear's output, the activation's (N, Fm)
    int d_in_out_;            // scratch: the gradient of the input linear's output
    int rows_, width_;        // N, Fm
    std::size_t in_count_;    // elements of the input linear's output: N·Fm or N·2Fm
};

}  // namespace trident::model
