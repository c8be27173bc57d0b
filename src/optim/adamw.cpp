// AdamW and clipping (see adamw.h).
#include "optim/adamw.h"

#include <cmath>

namespace trident::optim {

AdamW::AdamW(kernels::Ops& ops, const model::ParamLayout& layout, const config::TrainingConfig& cfg)
    : ops_(ops), cfg_(cfg), total_(layout.total()), m_(ops, layout.total()), v_(ops, layout.total()) {
    for (const auto& t : layout.tensors()) {
        if (!ranges_.empty() && ranges_.back().decay == t.decay &&
            ranges_.back().offset + ranges_.back().count == t.offset) {
            ranges_.back().count += t.numel;
        } else {
            ranges_.push_back(Range{t.offset, t.numel, t.decay});
        }
    }
}

double AdamW::grad_norm(const float* grads) const {
    return std::sqrt(ops_.sum_of_squares(grads, total_));
}

float AdamW::clip(float* grads, double norm) const {
    if (cfg_.grad_clip <= 0 || norm <= cfg_.grad_clip) return 1.0f;
    const float factor = static_cast<float>(cfg_.grad_clip / (norm + 1e-6));
    ops_.scale(grads, total_, factor);
    return factor;
}

void AdamW::step(float* params, const float* grads, double lr) {
    ++step_;
    for (const Range& r : ranges_) {
        ops_.adamw_update(params + r.offset, grads + r.offset, m_.data() + r.offset,
                          v_.data() + r.offset, r.count, static_cast<float>(lr),
                          static_cast<float>(cfg_.beta1), static_cast<float>(cfg_.beta2),
                          static_cast<float>(cfg_.eps),
                          r.decay ? static_cast<float>(cfg_.weight_decay) : 0.0f, step_);
    }
}

}  // namespace trident::optim
