// A layer's feed-forward sublayer. GPT-2's: the column-split fc linear (H -> F, its columns
// split over the tensor group), GELU (tanh form), the row-split fc_proj linear (F -> H), whose
// partial outputs the tensor group reduces.
//
// Shapes (this rank): input x (R, H) = the norm's output; fc's output and the GELU's (N, Fm)
// kept for the backward; output (R, H), with fc_proj's bias.
//
// Llama's (SwiGLU): the gate and up linears, column-split and run as one (H -> 2F, their weights
// adjacent), SwiGLU down's input silu(gate)·up, the row-split down linear (F -> H). Shapes
// (this rank): gate and up's output (N, 2Fm) and SwiGLU's (N, Fm) kept for the backward.
//
// A feed-forward sublayer is one kind of part (docs/ARCHITECTURE.md, "How to add a layer
// kind"): each is an implementation of FeedForward, and an MLP of another activation is Mlp
// with another MlpActivation.
#pragma once

#include <memory>

#include "model/linear.h"
#include "model/model_spec.h"

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
    // Whether its backward exchanges rows over the expert group (model/moe_dispatch.h), under
    // which the work deferred to it runs (model/part_context.h, Deferred).
    virtual bool exchanges() const { return false; }
};

// The activation between an MLP's two linears, on this rank's N rows of Fm columns: what one
// kind of MLP differs from another in, besides its tensors (model/part_kinds.h). GELU on fc's
// output (N, Fm), SwiGLU's silu(gate)·up on the fused gate and up linear's output (N, 2Fm).
class MlpActivation {
public:
    virtual ~MlpActivation() = default;
    // Columns of the input linear's output per output column (1, or 2 for a gated one).
    virtual int inputs_per_output() const = 0;
    // The names of the buffers the MLP keeps: the input linear's output, the activation's, and
    // the scratch of the former's gradient.
    struct Names {
        const char *in_out, *activated, *d_in_out;
    };
    virtual Names names() const = 0;
    // out (N, Fm) from in (N, k·Fm).
    virtual void forward(PartContext& ctx, kernels::Ptr out, kernels::ConstPtr in, int rows,
                         int width) const = 0;
    // din (N, k·Fm) += the gradient of in from dout (N, Fm).
    virtual void backward(PartContext& ctx, kernels::Ptr din, kernels::ConstPtr in,
                          kernels::ConstPtr dout, int rows, int width) const = 0;
};

// SwiGLU's silu(gate)·up (Llama's activation), for the parts that build an Mlp of it.
std::unique_ptr<MlpActivation> swiglu_activation();

// An MLP: the column-split input linear, the activation, the row-split output linear.
class Mlp final : public FeedForward {
public:
    // `in`: H -> k·Fm (k = activation.inputs_per_output()); `out`: Fm -> H.
    Mlp(std::unique_ptr<MlpActivation> activation, const LinearSpec& in, const LinearSpec& out,
        const Dims& d, SetSpec& set, ScratchSpec& scratch);

    kernels::Ptr forward(PartContext& ctx, const Pass& pass, kernels::ConstPtr x,
                         bool to_output) const override;
    kernels::ConstPtr backward(PartContext& ctx, const Pass& pass, kernels::ConstPtr x,
                               kernels::ConstPtr dy, BackwardPart part) const override;
    void backward_weight(PartContext& ctx, const Pass& pass, kernels::ConstPtr x) const override;
    void finish_grads(PartContext& ctx) const override;

private:
    std::unique_ptr<MlpActivation> activation_;
    std::unique_ptr<Linear> in_, out_;
    int in_out_, activated_;  // slots: the input linear's output, the activation's (N, Fm)
    int d_in_out_;            // scratch: the gradient of the input linear's output
    int rows_, width_;        // N, Fm
    std::size_t in_count_;    // elements of the input linear's output: N·k·Fm
};

// What an MLP of one activation (GELU, relu(x)²) keeps as Korthikanti et al. count GPT-2's
// (§4.1, F = 4·H there): the input linear's input 2 and the output's dropout mask 1 whole, the
// activation's input and output 2·F/H each split (model/part_kinds.h, ActivationsFn).
ActivationTerms one_activation_terms(const GptShape& s, int tensor);

}  // namespace trident::model
