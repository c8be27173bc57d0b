// Dynamic loss scaling and the non-finite policy (see loss_scaler.h).
#include "optim/loss_scaler.h"

#include <algorithm>
#include <string>

#include "kernels/error.h"

namespace trident::optim {

LossScaler::LossScaler(const config::TrainingConfig& cfg)
    : dynamic_(cfg.precision == kernels::DType::f16),
      window_(cfg.loss_scale_window),
      min_scale_(cfg.min_loss_scale),
      scale_(dynamic_ ? cfg.loss_scale : 1.0) {}

bool LossScaler::update(bool finite, int step) {
    if (!dynamic_) return true;  // the trainer judges (train/step_guard.h)
    if (!finite) {
        if (scale_ <= min_scale_)
            throw Error("step " + std::to_string(step) +
                        ": the gradients overflow at the smallest "
                        "loss scale (training.min_loss_scale = " +
                        std::to_string(min_scale_) + "); training stopped");
        scale_ = std::max(min_scale_, scale_ / 2);
        good_steps_ = 0;
        return false;
    }
    if (++good_steps_ == window_) {
        scale_ *= 2;
        good_steps_ = 0;
    }
    return true;
}

void LossScaler::restore(double scale, int good_steps) {
    scale_ = scale;
    good_steps_ = good_steps;
}

}  // namespace trident::optim
