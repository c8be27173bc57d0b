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

struct SelfAttentionSpec {
    LinearSpec qkv, proj;
    int head_begin = 0, heads_total = 0;  // this rank's heads among all
};

class SelfAttention {
public:
    SelfAttention(const SelfAttentionSpec& spec, const Dims& d,
                  const AttentionSavedFn& attention_saved, SetSpec& set, ScratchSpec& scratch);

    // This rank's rows of the output (R, H), in the scratch.
    kernels::Ptr forward(PartContext& ctx, const Pass& pass, kernels::ConstPtr x, float drop) const;
    // This rank's rows of the input's gradient (R, H), in the scratch, from dy (R, H).
    // `rebuild`: selective recompute dropped what the core keeps.
    kernels::ConstPtr backward(PartContext& ctx, const Pass& pass, kernels::ConstPtr x,
                               kernels::ConstPtr dy, float drop, BackwardPart part,
                               bool rebuild) const;
    void backward_weight(PartContext& ctx, const Pass& pass, kernels::ConstPtr x) const;
    void finish_grads(PartContext& ctx) const;

private:
    Linear qkv_linear_;
    std::unique_ptr<AttentionCore> core_;
    Linear proj_;
    int qkv_, out_;  // slots: (N, 3Hm), (N, Hm)
    int d_qkv_;      // scratch: (N, 3Hm)
    std::size_t qkv_count_;
};

}  // namespace trident::model
