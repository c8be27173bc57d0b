// The learning-rate schedule of lr_schedule.h.
#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace trident::optim {

double learning_rate(const config::TrainingConfig& t, int step) {
    if (step < t.warmup_steps) return t.lr * (step + 1) / t.warmup_steps;
    const double progress =
        static_cast<double>(step - t.warmup_steps) / std::max(1, t.steps - t.warmup_steps);
    switch (t.decay) {
        case config::Decay::cosine:
            return t.min_lr +
                   (t.lr - t.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
        case config::Decay::linear:
            return t.lr - (t.lr - t.min_lr) * progress;
        case config::Decay::constant:
            break;
    }
    return t.lr;
}

}  // namespace trident::optim
