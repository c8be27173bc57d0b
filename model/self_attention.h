// A layer's attention sublayer: the column-split qkv linear (heads split over the tensor group),
// the attention core of this rank's heads (model/attention_core.h: local, ring or Ulysses) and
// the row-split output projection, whose partial outputs the tensor group reduces.
//
// Shapes (this rank): input x (R, H) = the norm's output; qkv (N, 3Hm) and the core's output
// (N, Hm) kept for the backward; output (R, H), with the projection's bias.
#pragma once

#include <memory>

#include "model/attention_core.h"
#include "model/linear.h"

namespace trident::model {

// A layer's attention sublayer: GPT-2's (SelfAttention, below) or Llama's (GroupedAttention,
// model/grouped_attention.h), each an input linear producing this rank's q, k, v, an attention
// core of this rank's heads, and the output projection. What lies between the input linear and
// the core is each kind's own (forward, backward); a different attention block is another
// implementation (docs/ARCHITECTURE.md, "How to add a layer kind").
class Attention {
public:
    virtual ~Attention() = default;
    // This rank's rows of the output (R, H), in the scratch.
    virtual kernels::Ptr forward(PartContext& ctx, const Pass& pass, kernels::ConstPtr x,
                                 float drop) const = 0;
    // This rank's rows of the input's gradient (R, H), in the scratch, from dy (R, H).
    // `rebuild`: selective recompute dropped what the core keeps.
    virtual kernels::ConstPtr backward(PartContext& ctx, const Pass& pass, kernels::ConstPtr x,
                                       kernels::ConstPtr dy, float drop, BackwardPart part,
                                       bool rebuild) const = 0;
    virtual void backward_weight(PartContext& ctx, const Pass& pass, kernels::ConstPtr x) const;
    // Completes the gradients that are partial sums over ranks, once per reduction.
    virtual void finish_grads(PartContext& ctx) const;

protected:
    // The linears and the core of this rank's heads among `heads_total`, from `head_begin`:
    // local, or ring or Ulysses over the context group. The buffers are declared in the order
    // of the forward: the input linear's, the core's, the projection's, the core's output.
    // `make_core`: the core's maker (MakeCore), empty for training's.
    Attention(const LinearSpec& qkv, const LinearSpec& proj, int head_begin, int heads_total,
              const MakeCore& make_core, const Dims& d, const AttentionSavedFn& attention_saved,
              SetSpec& set, ScratchSpec& scratch);

    std::unique_ptr<Linear> qkv_linear_;
    std::unique_ptr<AttentionCore> core_;
    std::unique_ptr<Linear> proj_;
    int out_;  // slot: the core's output (N, Hm)
};

struct SelfAttentionSpec {
    LinearSpec qkv, proj;
    int head_begin = 0, heads_total = 0;  // this rank's heads among all
    MakeCore make_core;                   // empty: training's core
};

class SelfAttention final : public Attention {
public:
    SelfAttention(const SelfAttentionSpec& spec, const Dims& d,
                  const AttentionSavedFn& attention_saved, SetSpec& set, ScratchSpec& scratch);

    kernels::Ptr forward(PartContext& ctx, const Pass& pass, kernels::ConstPtr x,
                         float drop) const override;
    kernels::ConstPtr backward(PartContext& ctx, const Pass& pass, kernels::ConstPtr x,
                               kernels::ConstPtr dy, float drop, BackwardPart part,
                               bool rebuild) const override;

private:
    int qkv_;    // slot: (N, 3Hm)
    int d_qkv_;  // scratch: (N, 3Hm)
    std::size_t qkv_count_;
};

}  // namespace trident::model
