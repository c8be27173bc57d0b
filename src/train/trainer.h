// One training step and one validation pass over the model, independent of where the tokens
// come from: the `train` command feeds it the dataset, the `bench` command random tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "config/config.h"
#include "kernels/ops.h"
#include "model/gpt.h"
#include "optim/adamw.h"

namespace trident::train {

// Fills the inputs and targets (T tokens each) of global sample k.
using SampleFn = std::function<void(uint64_t sample, std::span<int32_t> inputs,
                                    std::span<int32_t> targets)>;

struct StepResult {
    double loss = 0;       // mean over every token of the global batch, before the update
    double grad_norm = 0;  // before clipping
    double lr = 0;
    double seconds = 0;    // wall time of the whole step
    parallel::CommStats tensor_comm;  // what the tensor-parallel group moved in the step
};

class Trainer {
public:
    // `tensor`: this rank's tensor-parallel group (null: one process).
    Trainer(const config::Config& cfg, kernels::Ops& ops, parallel::Comm* tensor = nullptr);

    model::Gpt& model() { return model_; }

    // Step `step` (0-based): forward and backward over every microbatch of the global batch
    // (samples step*B ... step*B + B - 1), clipping, AdamW.
    StepResult step(int step, const SampleFn& sample);
    // The first half of a step: the gradients of its global batch, in model().grads().
    // Returns the mean loss over every token of the batch.
    double accumulate_gradients(int step, const SampleFn& sample);
    // Mean loss over `microbatches` microbatches of samples 0, 1, ...: no dropout, no update.
    double evaluate(const SampleFn& sample, int microbatches);

private:
    // Loads microbatch samples first .. first + micro_batch - 1 into inputs_/targets_.
    void load_microbatch(const SampleFn& sample, uint64_t first);

    const config::Config& cfg_;
    parallel::Comm* tensor_;
    model::Gpt model_;
    optim::AdamW optimizer_;
    std::vector<int32_t> inputs_, targets_;  // (micro_batch, T)
};

}  // namespace trident::train
