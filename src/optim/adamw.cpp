// AdamW and clipping (see adamw.h).
#include "optim/adamw.h"

#include <cmath>

namespace trident::optim {

AdamW::AdamW(kernels::Ops& ops, const model::ParamLayout& layout, const config::TrainingConfig& cfg,
             parallel::Comm* tensor, parallel::Comm* pipeline)
    : ops_(ops), cfg_(cfg), total_(layout.total()), tensor_(tensor ? *tensor : solo_),
      pipeline_(pipeline ? *pipeline : solo_), m_(ops, layout.total()), v_(ops, layout.total()) {
    for (const auto& t : layout.tensors()) {
        const bool replica = t.split == model::Split::replicated && layout.tensor_rank() != 0;
        const bool second_wte = t.name == "wte.weight" && !layout.plan().first();
        const bool counted = !replica && !second_wte;
        Range* last = ranges_.empty() ? nullptr : &ranges_.back();
        if (last && last->decay == t.decay && last->counted == counted &&
            last->offset + last->count == t.offset) {
            last->count += t.numel;
        } else {
            ranges_.push_back(Range{t.offset, t.numel, t.decay, counted});
        }
    }
}

double AdamW::grad_norm(const float* grads) const {
    double sum = 0;
    for (const Range& r : ranges_)
        if (r.counted) sum += ops_.sum_of_squares(grads + r.offset, r.count);
    // Reduced as a float pair (high part, remainder) so the sum keeps double precision.
    float parts[2] = {static_cast<float>(sum), 0.0f};
    parts[1] = static_cast<float>(sum - static_cast<double>(parts[0]));
    tensor_.all_reduce(parts, 2);
    pipeline_.all_reduce(parts, 2);
    return std::sqrt(static_cast<double>(parts[0]) + static_cast<double>(parts[1]));
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
