// The learning-rate schedule: linear warm-up, then cosine, linear or constant decay to min_lr.
#pragma once

#include "config/config.h"

namespace trident::optim {

// Learning rate of step `step` (0-based):
//   step < warmup:  lr * (step + 1) / warmup
//   after:          progress p = (step - warmup) / max(1, steps - warmup), in [0, 1)
//                   cosine   min_lr + (lr - min_lr) * (1 + cos(pi p)) / 2
//                   linear   lr - (lr - min_lr) * p
//                   constant lr
double learning_rate(const config::TrainingConfig& t, int step);

}  // namespace trident::optim
