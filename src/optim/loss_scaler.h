// Dynamic loss scaling for fp16 (Micikevicius et al., "Mixed Precision Training"): the loss
// is multiplied by a scale S before backward so that small gradients survive fp16's range,
// and the gradients are divided by S before the update.
//
// A step whose gradients overflowed (inf or NaN anywhere in the grid) is skipped: no update,
// S halves (not below the floor), and the count of clean steps restarts; an overflow at the
// floor stops training, since no scale is left to try. After `window`
// clean steps in a row S doubles. The decision comes from the global gradient norm, which
// every rank computes identically from sums over the whole grid (a sum carries inf and NaN
// along), so every rank skips the same steps.
//
// bf16 and fp32 have fp32's range and need no scale (S = 1); what a non-finite step does there
// is the trainer's verdict (train/step_guard.h), not an overflow.
#pragma once

#include "config/config.h"

namespace trident::optim {

class LossScaler {
public:
    explicit LossScaler(const config::TrainingConfig& cfg);

    bool dynamic() const { return dynamic_; }  // fp16
    double scale() const { return scale_; }
    int good_steps() const { return good_steps_; }

    // After a step's gradients: false where fp16's gradients overflowed (the update is
    // skipped), else true (bf16, fp32: always). Updates the scale. Throws (naming the
    // 1-based step) where the scale is at its floor.
    bool update(bool finite, int step);

    // The state a checkpoint keeps.
    void restore(double scale, int good_steps);

private:
    bool dynamic_;
    int window_;
    double min_scale_;
    double scale_;
    int good_steps_ = 0;
};

}  // namespace trident::optim
