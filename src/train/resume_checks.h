// What a resume changes of the run it continues, found before the first step: config fields
// that change which samples each step draws (training.seed, training.global_batch: refused
// unless checkpoint.allow_order_change), the optimizer (optimizer.name: refused unless
// checkpoint.allow_optimizer_change and the checkpoint's was AdamW), the schedule's length
// (training.steps: said, since the learning rate's warmup and decay are laid out over it), and
// checkpoints of later steps than the one resumed that the resumed run's first save deletes
// (checkpoint.h): said.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"

namespace trident::train {

// "training.seed: 1234 in the checkpoint's run, 7 now; training.global_batch: ...", or ""
// where both are as they were. `then` is the config the checkpoint recorded (config.yaml).
std::string order_changes(const config::Config& then, const config::Config& now);

// "optimizer.name: adamw in the checkpoint's run, muon now", or "" where it is the same.
std::string optimizer_change(const config::Config& then, const config::Config& now);

// One line saying that training.steps changed and so the learning-rate schedule is reshaped
// from `step` on, or "" where it did not.
std::string schedule_change(const config::Config& then, const config::Config& now, int step);

// The step_* directories of `dir` that a save of `step` removes (save_checkpoint): those of
// later steps, and one of that step, which it replaces. Oldest first.
std::vector<std::string> checkpoints_from(const std::string& dir, int step);

}  // namespace trident::train
