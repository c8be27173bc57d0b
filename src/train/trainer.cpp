// The training step and validation pass (see trainer.h).
#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <string>

#include "error.h"
#include "kernels/random.h"
#include "optim/lr_schedule.h"
#include "parallel/watchdog.h"
#include "pipeline/schedule.h"
#include "train/model_shape.h"

namespace trident::train {

namespace {

// Dropout seeds are a separate stream from initialisation's.
constexpr uint64_t kDropoutStream = 0x64726F706F7574ull;  // "dropout"


// The config spells the schedules as the pipeline names them.
pipeline::Kind schedule_kind(config::Schedule s) {
    return pipeline::parse_kind(config::to_string(s));
}

// 16-bit parameters, activations and (unless fp32_grad_accumulation) gradients.
model::Precision precision_of(const config::TrainingConfig& t) {
    const kernels::DType p = t.precision;
    return model::Precision{p, t.fp32_grad_accumulation ? kernels::DType::f32 : p, p};
}

model::Recompute recompute_mode(config::Recompute r) {
    switch (r) {
        case config::Recompute::selective: return model::Recompute::selective;
        case config::Recompute::full: return model::Recompute::full;
        case config::Recompute::none: break;
    }
    return model::Recompute::none;
}

}  // namespace

Trainer::Trainer(const config::Config& cfg, kernels::Ops& ops, parallel::Grid* grid)
    : cfg_(cfg),
      ops_(ops),
      tensor_(grid ? grid->tensor() : solo_),
      pipeline_(grid ? grid->pipeline() : solo_),
      embedding_(grid ? grid->embedding() : solo_),
      data_(grid ? grid->data() : solo_),
      model_(ops, gpt_shape(cfg), cfg.training.micro_batch, static_cast<float>(cfg.model.dropout),
             &tensor_, cfg.parallel.sequence_parallel, stage_plan(cfg, grid ? grid->coordinates().pp : 0),
             static_cast<std::size_t>(data_.size()), recompute_mode(cfg.training.recompute),
             precision_of(cfg.training)),
      optimizer_(ops, model_.layout(), cfg.training,
                 optim::OptimizerGroups{&tensor_, &pipeline_, &data_}, cfg.parallel.zero_stage,
                 model_.buffer_size(), static_cast<std::size_t>(cfg.parallel.bucket_size),
                 optim::Overlap{cfg.parallel.overlap_grad_reduce, cfg.parallel.overlap_param_gather}),
      scaler_(cfg.training),
      executor_(ops, model_, &pipeline_) {
    model_.set_split_backward(pipeline::splits_backward(schedule_kind(cfg.parallel.schedule)));
    executor_.set_trace(&trace_);
    optimizer_.set_trace(&trace_);
    model_.set_hooks({[this](std::size_t b, std::size_t e) { optimizer_.grads_final(b, e); },
                      [this](std::size_t b, std::size_t e) { optimizer_.params_needed(b, e); }});
}

MemoryUse Trainer::memory() const {
    MemoryUse m;
    m.parameters = model_.params_bytes();
    m.gradients = model_.grads_bytes();
    m.optimizer = optimizer_.state_bytes();
    m.activations = model_.activation_bytes();
    m.peak = ops_.peak_allocated_bytes();
    return m;
}

double Trainer::from_last_stage(double loss) {
    pipeline_.broadcast(&loss, 1, pipeline_.size() - 1);
    return loss;
}

double Trainer::accumulate_gradients(int step, const SampleFn& sample, double loss_scale) {
    const auto& t = cfg_.training;
    const model::StagePlan& plan = model_.layout().plan();
    // This data-parallel replica's slice of the global batch, in order (docs/ARCHITECTURE.md,
    // "Sampling").
    const uint64_t first_sample = static_cast<uint64_t>(step) * t.global_batch +
                                  static_cast<uint64_t>(data_.rank()) * (t.global_batch / data_.size());
    const int microbatches = cfg_.derived.grad_accum_steps;
    // Each token's share of the mean loss, times the loss scale (fp16; 1 otherwise).
    const float dloss =
        static_cast<float>(loss_scale / static_cast<double>(cfg_.derived.tokens_per_step));
    const std::size_t T = static_cast<std::size_t>(cfg_.model.seq_len);
    const auto first_of = [&](int mb) { return first_sample + static_cast<uint64_t>(mb) * t.micro_batch; };

    model_.zero_grads();
    const double loss_sum = executor_.run(
        pipeline::schedule(schedule_kind(cfg_.parallel.schedule), plan.stages, plan.chunks,
                           microbatches, plan.stage),
        [&](int mb, std::span<int32_t> in, std::span<int32_t> tgt) {
            for (int i = 0; i < t.micro_batch; ++i)
                sample(first_of(mb) + static_cast<uint64_t>(i), in.subspan(i * T, T),
                       tgt.subspan(i * T, T));
        },
        dloss, true, [&](int mb) { return kernels::hash64(t.seed ^ kDropoutStream, first_of(mb)); });
    // The LM head's copy of wte on the last stage and the embedding's on the first: the
    // tied weight's gradient is the sum of both, and final then.
    if (plan.stages > 1 && (plan.first() || plan.last())) {
        const model::ParamTensor* wte = model_.layout().find("wte.weight");
        embedding_.all_reduce(model_.grads() + wte->offset, wte->numel);
        optimizer_.grads_final(wte->offset, wte->offset + wte->numel);
    }
    // The step's loss: the mean of the replicas' means (equal token counts).
    double loss = from_last_stage(loss_sum / microbatches);
    data_.all_reduce(&loss, 1);
    return loss / data_.size();
}


StepResult Trainer::step(int step, const SampleFn& sample) {
    const auto t0 = std::chrono::steady_clock::now();
    parallel::set_step(step + 1);
    const parallel::ScopedPhase phase(parallel::Phase::training);
    tensor_.reset_stats();
    data_.reset_stats();
    StepResult r;
    r.loss_scale = scaler_.scale();
    optimizer_.start_step(model_.grads());  // buckets reduce as the backward completes them
    r.loss = accumulate_gradients(step, sample, r.loss_scale);
    optimizer_.reduce_gradients(model_.grads());
    // The norm of the scaled gradients, the same on every rank: inf or NaN everywhere if
    // any gradient overflowed anywhere, so every rank takes the same decision.
    const double scaled_norm = optimizer_.grad_norm(model_.grads());
    r.grad_norm = scaled_norm / r.loss_scale;
    r.lr = optim::learning_rate(cfg_.training, step);
    r.skipped = !scaler_.update(std::isfinite(scaled_norm) && std::isfinite(r.loss), step + 1);
    if (!r.skipped) {
        const io::ScopedSpan span(&trace_, io::SpanKind::optimizer, -1, -1);
        const double factor = optimizer_.clip_factor(r.grad_norm) / r.loss_scale;
        optimizer_.step(model_.params(), model_.grads(), r.lr, static_cast<float>(factor));
    }
    r.tensor_comm = tensor_.stats();
    r.data_comm = data_.stats();
    r.memory = memory();
    r.activation_sets = model_.activation_sets();
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    parallel::first_step_done();
    return r;
}

double Trainer::evaluate(const SampleFn& sample, int microbatches) {
    const parallel::ScopedPhase phase(parallel::Phase::validation);
    const auto& t = cfg_.training;
    const std::size_t T = static_cast<std::size_t>(cfg_.model.seq_len);
    const double loss_sum = executor_.run(
        pipeline::forward_only(model_.layout().plan(), microbatches),
        [&](int mb, std::span<int32_t> in, std::span<int32_t> tgt) {
            for (int i = 0; i < t.micro_batch; ++i)
                sample(static_cast<uint64_t>(mb) * t.micro_batch + static_cast<uint64_t>(i),
                       in.subspan(i * T, T), tgt.subspan(i * T, T));
        },
        0.0f, false, [](int) { return uint64_t{0}; });
    return from_last_stage(loss_sum / microbatches);
}

std::vector<float> Trainer::gather_full(std::vector<float> (model::Gpt::*to_host)() const) {
    optimizer_.finish_param_gather();
    const std::vector<float> local = (model_.*to_host)();
    std::vector<float> full = model_.share_of_full(local);
    tensor_.all_reduce(full.data(), full.size());
    pipeline_.all_reduce(full.data(), full.size());
    return full;
}

std::vector<float> Trainer::full_params() { return gather_full(&model::Gpt::params_to_host); }

std::vector<float> Trainer::full_grads() { return gather_full(&model::Gpt::grads_to_host); }

void Trainer::write_trace(const std::string& path) {
    std::vector<std::string> names;
    for (int pp = 0; pp < pipeline_.size(); ++pp)
        for (int tp = 0; tp < tensor_.size(); ++tp)
            names.push_back("rank " + std::to_string(tp + tensor_.size() * pp) + ": stage " +
                            std::to_string(pp) + ", tensor " + std::to_string(tp));
    // Data-parallel replicas run the same schedule: the first one's trace stands for all.
    if (data_.rank() == 0) trace_.write(path, tensor_, pipeline_, names);
}

}  // namespace trident::train
