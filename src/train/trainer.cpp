// The training step and validation pass (see trainer.h).
#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <string>

#include "error.h"
#include "kernels/random.h"
#include "model/context_split.h"
#include "model/lora.h"
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

// ZeRO-2 shards the gradients, ZeRO-3 the parameters too (model/gpt.h).
model::Sharding sharding_of(const config::ParallelConfig& p, int replica) {
    return model::Sharding{replica, p.zero_stage >= 2, p.zero_stage >= 3, p.sharded_accumulation};
}

model::ContextMode context_mode(config::ContextMode m) {
    return m == config::ContextMode::ulysses ? model::ContextMode::ulysses
                                             : model::ContextMode::ring;
}

model::Recompute recompute_mode(config::Recompute r) {
    switch (r) {
        case config::Recompute::selective:
            return model::Recompute::selective;
        case config::Recompute::full:
            return model::Recompute::full;
        case config::Recompute::none:
            break;
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
      context_(grid ? grid->context() : solo_),
      data_context_(grid ? grid->data_context() : solo_),
      model_(ops, gpt_shape(cfg), cfg.training.micro_batch, static_cast<float>(cfg.model.dropout),
             &tensor_, cfg.parallel.sequence_parallel,
             stage_plan(cfg, grid ? grid->coordinates().pp : 0),
             static_cast<std::size_t>(data_context_.size()), recompute_mode(cfg.training.recompute),
             precision_of(cfg.training), sharding_of(cfg.parallel, data_context_.rank()),
             model::ContextSplit{&context_, context_mode(cfg.parallel.context_mode)},
             adapters_of(cfg)),
      // The replicas of the weights are the D·C ranks of the data-context group: the optimizer
      // sums the gradients and shards its state over all of them, as Megatron-Core does.
      // What trains: every parameter, or the adapters of a frozen model (whose parameters'
      // gathers after the update are too small to overlap with anything).
      optimizer_(ops, model_.trainable_layout(), cfg.training,
                 optim::OptimizerGroups{&tensor_, &pipeline_, &data_context_},
                 cfg.parallel.zero_stage, model_.trainable_params(), model_.trainable_grads(),
                 static_cast<std::size_t>(cfg.parallel.bucket_size),
                 optim::Overlap{cfg.parallel.overlap_grad_reduce,
                                cfg.parallel.overlap_param_gather && !model_.frozen()}),
      scaler_(cfg.training),
      executor_(ops, model_, &pipeline_) {
    model_.set_split_backward(pipeline::splits_backward(schedule_kind(cfg.parallel.schedule)));
    executor_.set_trace(&trace_);
    optimizer_.set_trace(&trace_);
    const auto grads_final = [this](std::size_t b, std::size_t e) { optimizer_.grads_final(b, e); };
    // A frozen model announces its adapters' gradients only: the other hooks speak of its own
    // buffers, which the optimizer does not hold.
    if (model_.frozen()) {
        model_.set_hooks({grads_final, {}, {}, {}, {}});
        return;
    }
    model_.set_hooks({grads_final,
                      [this](std::size_t b, std::size_t e) { optimizer_.params_needed(b, e); },
                      [this](std::size_t b, std::size_t e) { optimizer_.params_prefetch(b, e); },
                      [this](std::size_t b, std::size_t e) { optimizer_.params_done(b, e); },
                      [this](std::size_t b, std::size_t e) { optimizer_.grads_needed(b, e); }});
}

MemoryUse Trainer::memory() const {
    MemoryUse m;
    m.parameters = model_.params_bytes() + model_.adapter_params().bytes();
    m.gradients = model_.grads_bytes() + model_.adapter_grads().bytes();
    m.optimizer = optimizer_.state_bytes();
    m.activations = model_.activation_bytes();
    m.peak = ops_.peak_allocated_bytes();
    return m;
}

void Trainer::tie_sharded_embedding() {
    const model::StagePlan& plan = model_.layout().plan();
    model::FlatBuffer& grads = model_.grads();
    if (plan.stages == 1 || !(plan.first() || plan.last()) || !grads.sharded()) return;
    // The first and the last stage hold the same wte unit, split alike over their replicas.
    const std::size_t u = grads.units_of(model_.layout().wte(), model_.layout().wte() + 1).first;
    embedding_.all_reduce(grads.shard_part(u), grads.part_size(u));
}

double Trainer::from_last_stage(double loss) {
    pipeline_.broadcast(&loss, 1, pipeline_.size() - 1);
    return loss;
}

void Trainer::fill_microbatch(const SampleFn& sample, uint64_t first, std::span<int32_t> inputs,
                              std::span<int32_t> targets) {
    const int T = cfg_.model.seq_len, T_local = model_.local_tokens();
    for (int i = 0; i < cfg_.training.micro_batch; ++i) {
        const std::size_t at = static_cast<std::size_t>(i) * static_cast<std::size_t>(T_local);
        const uint64_t k = first + static_cast<uint64_t>(i);
        if (context_.size() == 1) {
            sample(k, inputs.subspan(at, static_cast<std::size_t>(T)),
                   targets.subspan(at, static_cast<std::size_t>(T)));
            continue;
        }
        // The whole sample, then this context rank's tokens of it (and their targets).
        whole_inputs_.resize(static_cast<std::size_t>(T));
        whole_targets_.resize(static_cast<std::size_t>(T));
        sample(k, whole_inputs_, whole_targets_);
        const std::size_t n = static_cast<std::size_t>(T_local);
        model::take_context_tokens(whole_inputs_, inputs.subspan(at, n), 1, T, context_.size(),
                                   context_.rank());
        model::take_context_tokens(whole_targets_, targets.subspan(at, n), 1, T, context_.size(),
                                   context_.rank());
    }
}

double Trainer::accumulate_gradients(int step, const SampleFn& sample, double loss_scale) {
    const auto& t = cfg_.training;
    const model::StagePlan& plan = model_.layout().plan();
    // This data-parallel replica's slice of the global batch, in order (docs/ARCHITECTURE.md,
    // "Sampling").
    const uint64_t first_sample =
        static_cast<uint64_t>(step) * t.global_batch +
        static_cast<uint64_t>(data_.rank()) * (t.global_batch / data_.size());
    const int microbatches = cfg_.derived.grad_accum_steps;
    // Each token's share of the mean loss, times the loss scale (fp16; 1 otherwise).
    const float dloss =
        static_cast<float>(loss_scale / static_cast<double>(cfg_.derived.tokens_per_step));
    const auto first_of = [&](int mb) {
        return first_sample + static_cast<uint64_t>(mb) * t.micro_batch;
    };

    model_.zero_grads();
    const double loss_sum = executor_.run(
        pipeline::schedule(schedule_kind(cfg_.parallel.schedule), plan.stages, plan.chunks,
                           microbatches, plan.stage),
        [&](int mb, std::span<int32_t> in, std::span<int32_t> tgt) {
            fill_microbatch(sample, first_of(mb), in, tgt);
        },
        dloss, true,
        [&](int mb) { return kernels::hash64(t.seed ^ kDropoutStream, first_of(mb)); });
    // The LM head's copy of wte on the last stage and the embedding's on the first: the
    // tied weight's gradient is the sum of both, and final then (sharded gradients: summed
    // on the shards once reduced, tie_sharded_embedding).
    if (plan.stages > 1 && (plan.first() || plan.last()) && !model_.grads().sharded() &&
        !model_.frozen()) {
        const model::ParamTensor* wte = model_.layout().find("wte.weight");
        embedding_.all_reduce(model_.grads().at(wte->offset), wte->numel);
        optimizer_.grads_final(wte->offset, wte->offset + wte->numel);
    }
    // The step's loss: the mean of the means of the replicas and context ranks (equal token
    // counts).
    double loss = from_last_stage(loss_sum / microbatches);
    data_context_.all_reduce(&loss, 1);
    return loss / data_context_.size();
}

StepResult Trainer::step(int step, const SampleFn& sample) {
    const auto t0 = std::chrono::steady_clock::now();
    parallel::set_step(step + 1);
    const parallel::ScopedPhase phase(parallel::Phase::training);
    tensor_.reset_stats();
    context_.reset_stats();
    data_context_.reset_stats();
    StepResult r;
    r.loss_scale = scaler_.scale();
    optimizer_.start_step();  // buckets reduce as the backward completes them
    r.loss = accumulate_gradients(step, sample, r.loss_scale);
    optimizer_.reduce_gradients();
    tie_sharded_embedding();
    // The norm of the scaled gradients, the same on every rank: inf or NaN everywhere if
    // any gradient overflowed anywhere, so every rank takes the same decision.
    const double scaled_norm = optimizer_.grad_norm();
    r.grad_norm = scaled_norm / r.loss_scale;
    r.lr = optim::learning_rate(cfg_.training, step);
    r.skipped = !scaler_.update(std::isfinite(scaled_norm) && std::isfinite(r.loss), step + 1);
    if (!r.skipped) {
        const io::ScopedSpan span(&trace_, io::SpanKind::optimizer, -1, -1);
        const double factor = optimizer_.clip_factor(r.grad_norm) / r.loss_scale;
        optimizer_.step(r.lr, static_cast<float>(factor));
    }
    r.tensor_comm = tensor_.stats();
    r.context_comm = context_.stats();
    r.data_comm = data_context_.stats();
    r.memory = memory();
    r.activation_sets = model_.activation_sets();
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    parallel::first_step_done();
    return r;
}

double Trainer::evaluate(const SampleFn& sample, int sequences) {
    const parallel::ScopedPhase phase(parallel::Phase::validation);
    const auto& t = cfg_.training;
    // This replica's equal share of samples 0 .. sequences - 1, in order, as a step splits
    // its global batch (config validation makes it whole microbatches).
    const int share = sequences / data_.size();
    const int microbatches = share / t.micro_batch;
    const uint64_t first_sample = static_cast<uint64_t>(data_.rank()) * share;
    const double loss_sum = executor_.run(
        pipeline::forward_only(model_.layout().plan(), microbatches),
        [&](int mb, std::span<int32_t> in, std::span<int32_t> tgt) {
            fill_microbatch(sample, first_sample + static_cast<uint64_t>(mb) * t.micro_batch, in,
                            tgt);
        },
        0.0f, false, [](int) { return uint64_t{0}; });
    // The mean of the replicas' and context ranks' means (equal token counts).
    double loss = from_last_stage(loss_sum / microbatches);
    data_context_.all_reduce(&loss, 1);
    return loss / data_context_.size();
}

std::vector<float> Trainer::local(std::vector<float> (model::Gpt::*to_host)() const,
                                  const model::FlatBuffer& buffer) {
    optimizer_.finish_param_gather();
    std::vector<float> host = (model_.*to_host)();
    // Sharded, each element is on one replica and zero on the others.
    if (buffer.sharded()) data_context_.all_reduce(host.data(), host.size());
    return host;
}

std::vector<float> Trainer::local_params() {
    if (model_.frozen()) return local(&model::Gpt::adapters_to_host, model_.adapter_params());
    return local(&model::Gpt::params_to_host, model_.params());
}

std::vector<float> Trainer::gather_full(std::vector<float> (model::Gpt::*to_host)() const,
                                        const model::FlatBuffer& buffer) {
    const std::vector<float> local_part = local(to_host, buffer);
    const bool adapters = &buffer == &model_.adapter_params() || &buffer == &model_.adapter_grads();
    std::vector<float> full =
        adapters ? model_.adapter_share_of_full(local_part) : model_.share_of_full(local_part);
    tensor_.all_reduce(full.data(), full.size());
    pipeline_.all_reduce(full.data(), full.size());
    return full;
}

std::vector<float> Trainer::full_params() {
    std::vector<float> full = gather_full(&model::Gpt::params_to_host, model_.params());
    if (!model_.frozen()) return full;
    const std::vector<float> adapters =
        gather_full(&model::Gpt::adapters_to_host, model_.adapter_params());
    const model::GptShape& shape = model_.shape();
    model::merge_adapters(model::ParamLayout(shape), full.data(),
                          model::ParamLayout::adapters(shape, model_.adapters().shape),
                          adapters.data(), model_.adapters().scale);
    return full;
}

std::vector<float> Trainer::full_adapters() {
    return gather_full(&model::Gpt::adapters_to_host, model_.adapter_params());
}

std::vector<float> Trainer::full_adapter_grads() {
    return gather_full(&model::Gpt::adapter_grads_to_host, model_.adapter_grads());
}

std::vector<float> Trainer::full_grads() {
    return gather_full(&model::Gpt::grads_to_host, model_.grads());
}

void Trainer::write_trace(const std::string& path) {
    std::vector<std::string> names;
    for (int pp = 0; pp < pipeline_.size(); ++pp)
        for (int tp = 0; tp < tensor_.size(); ++tp)
            names.push_back("rank " + std::to_string(tp + tensor_.size() * pp) + ": stage " +
                            std::to_string(pp) + ", tensor " + std::to_string(tp));
    // Data-parallel replicas and context ranks run the same schedule: the first one's trace
    // stands for all.
    if (data_.rank() == 0 && context_.rank() == 0) trace_.write(path, tensor_, pipeline_, names);
}

}  // namespace trident::train
