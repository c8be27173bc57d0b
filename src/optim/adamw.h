// AdamW with global-norm gradient clipping over the model's flat parameter buffer.
//
// Numerics follow torch.optim.AdamW (bias-corrected moments, decoupled weight decay) and
// torch.nn.utils.clip_grad_norm_ (scale by max/(norm + 1e-6) when the norm exceeds max).
// Decay applies to weight matrices and embeddings only; the layout says which ranges.
// Under tensor and pipeline parallelism each rank updates its part; the gradient norm is
// global over the tensor and pipeline groups, with tensors held more than once counted once:
// replicated ones (LayerNorms, row-parallel biases, wpe) on tensor rank 0, the tied wte on
// the first stage.
#pragma once

#include <vector>

#include "config/config.h"
#include "kernels/ops.h"
#include "model/gpt.h"
#include "model/param_layout.h"
#include "parallel/comm.h"
#include "parallel/solo_comm.h"

namespace trident::optim {

class AdamW {
public:
    AdamW(kernels::Ops& ops, const model::ParamLayout& layout, const config::TrainingConfig& cfg,
          parallel::Comm* tensor = nullptr, parallel::Comm* pipeline = nullptr);

    // Global L2 norm of the gradients (before clipping); collective over the tensor and
    // pipeline groups.
    double grad_norm(const float* grads) const;
    // Clips `grads` in place to the configured norm, given their norm; returns the factor
    // applied (1 when not clipped).
    float clip(float* grads, double norm) const;
    // One update of every parameter with learning rate lr; advances the step count.
    void step(float* params, const float* grads, double lr);

    int steps_taken() const { return step_; }

private:
    struct Range {
        std::size_t offset, count;
        bool decay;
        bool counted;  // in the norm on this rank (held once here, not a copy)
    };

    kernels::Ops& ops_;
    config::TrainingConfig cfg_;
    std::size_t total_;
    parallel::SoloComm solo_;
    parallel::Comm& tensor_;
    parallel::Comm& pipeline_;
    std::vector<Range> ranges_;  // maximal runs of tensors alike in decay and counting
    model::DeviceBuffer m_, v_;  // Adam's first and second moments, fp32
    int step_ = 0;
};

}  // namespace trident::optim
