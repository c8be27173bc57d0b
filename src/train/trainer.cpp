// The training step and validation pass (see trainer.h).
#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <string>

#include "error.h"
#include "kernels/random.h"
#include "optim/lr_schedule.h"
#include "train/model_shape.h"

namespace trident::train {

namespace {

// Dropout seeds are a separate stream from initialisation's.
constexpr uint64_t kDropoutStream = 0x64726F706F7574ull;  // "dropout"

}  // namespace

Trainer::Trainer(const config::Config& cfg, kernels::Ops& ops, parallel::Comm* tensor)
    : cfg_(cfg),
      tensor_(tensor),
      model_(ops, gpt_shape(cfg), cfg.training.micro_batch, static_cast<float>(cfg.model.dropout),
             tensor, cfg.parallel.sequence_parallel),
      optimizer_(ops, model_.layout(), cfg.training, tensor) {
    const std::size_t n = static_cast<std::size_t>(cfg.training.micro_batch) * cfg.model.seq_len;
    inputs_.resize(n);
    targets_.resize(n);
}

void Trainer::load_microbatch(const SampleFn& sample, uint64_t first) {
    const std::size_t T = static_cast<std::size_t>(cfg_.model.seq_len);
    for (int i = 0; i < cfg_.training.micro_batch; ++i) {
        const std::size_t at = static_cast<std::size_t>(i) * T;
        sample(first + static_cast<uint64_t>(i), std::span(inputs_).subspan(at, T),
               std::span(targets_).subspan(at, T));
    }
}

double Trainer::accumulate_gradients(int step, const SampleFn& sample) {
    const auto& t = cfg_.training;
    const uint64_t first_sample = static_cast<uint64_t>(step) * t.global_batch;
    const int accum = cfg_.derived.grad_accum_steps;
    const float dloss = 1.0f / static_cast<float>(cfg_.derived.tokens_per_step);

    model_.zero_grads();
    double loss_sum = 0;
    for (int mb = 0; mb < accum; ++mb) {
        const uint64_t first = first_sample + static_cast<uint64_t>(mb) * t.micro_batch;
        load_microbatch(sample, first);
        const uint64_t dropout_seed = kernels::hash64(t.seed ^ kDropoutStream, first);
        loss_sum += model_.forward(inputs_.data(), targets_.data(), true, dropout_seed);
        model_.backward(dloss);
    }
    model_.finish_gradients();
    return loss_sum / accum;
}

StepResult Trainer::step(int step, const SampleFn& sample) {
    const auto t0 = std::chrono::steady_clock::now();
    if (tensor_) tensor_->reset_stats();
    StepResult r;
    r.loss = accumulate_gradients(step, sample);
    r.grad_norm = optimizer_.grad_norm(model_.grads());
    if (!std::isfinite(r.grad_norm) || !std::isfinite(r.loss))
        throw Error("step " + std::to_string(step + 1) + ": the loss or gradients are not finite (loss " +
                    std::to_string(r.loss) + ", gradient norm " + std::to_string(r.grad_norm) +
                    "); try a lower training.lr or a smaller training.grad_clip");
    optimizer_.clip(model_.grads(), r.grad_norm);
    r.lr = optim::learning_rate(cfg_.training, step);
    optimizer_.step(model_.params(), model_.grads(), r.lr);
    if (tensor_) r.tensor_comm = tensor_->stats();
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
}

double Trainer::evaluate(const SampleFn& sample, int microbatches) {
    double sum = 0;
    for (int mb = 0; mb < microbatches; ++mb) {
        load_microbatch(sample, static_cast<uint64_t>(mb) * cfg_.training.micro_batch);
        sum += model_.forward(inputs_.data(), targets_.data(), false, 0);
    }
    return sum / microbatches;
}

}  // namespace trident::train
