// The last global chunk's end: the final norm, the LM head (a column-split linear over the
// padded vocabulary, no bias: this rank's slice of the token embedding when tied, else of a
// weight of its own), and the
// vocab-parallel cross-entropy, which never gathers the logits: each rank reduces its slice to
// three numbers per row (Ops::cross_entropy_partials), combined over the tensor group.
//
// Shapes (this rank): input x (R, H); logits (N, Vm), turned into their gradient by the
// backward (and kept so for the weight gradient of a split backward); the per-row loss
// statistics and losses fp32 (N).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "model/linear.h"
#include "model/norm.h"

namespace trident::model {

struct LmHeadSpec {
    std::size_t weight = 0;  // offset of (Vm, H) in the parameter buffer
    int vocab_begin = 0;
    int vocab = 0;  // V, the real vocabulary
};

class LmHead {
public:
    // `norm`: the final norm, its buffers declared into `set` before the head's.
    LmHead(const LmHeadSpec& spec, std::unique_ptr<Norm> norm, const Dims& d, SetSpec& set,
           ScratchSpec& scratch);

    // The logits (N, Vm) of this rank's vocabulary slice from x (R, H).
    void forward(PartContext& ctx, const Pass& pass, kernels::ConstPtr x) const;
    kernels::ConstPtr logits(const Pass& pass) const { return pass.buffers[logits_]; }
    // The loss of each row against the host's targets (B, T): its mean over the rows is added
    // into `loss_sum` (one f64 on the device).
    void loss(PartContext& ctx, const Pass& pass, const int32_t* targets, double* loss_sum) const;
    // d_x (R, H) = the gradient of x, each token's loss weighted by dloss (overwritten).
    void backward(PartContext& ctx, const Pass& pass, kernels::ConstPtr x, float dloss,
                  kernels::Ptr d_x, BackwardPart part) const;
    void backward_weight(PartContext& ctx, const Pass& pass, kernels::ConstPtr x) const;
    void finish_grads(PartContext& ctx) const { norm_->finish_grads(ctx); }

private:
    LmHeadSpec spec_;
    std::unique_ptr<Norm> norm_;
    Linear linear_;
    int logits_, stats_, lse_, losses_, targets_;  // slots
};

}  // namespace trident::model
