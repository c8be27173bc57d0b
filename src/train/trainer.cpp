// The training step and validation pass (see trainer.h).
#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "config/model_shape.h"
#include "kernels/error.h"
#include "kernels/random.h"
#include "model/context_split.h"
#include "model/lora.h"
#include "optim/lr_schedule.h"
#include "parallel/agreement.h"
#include "parallel/watchdog.h"
#include "pipeline/schedule.h"

namespace trident::train {

namespace {

// Dropout seeds are a separate stream from initialisation's.
constexpr uint64_t kDropoutStream = 0x64726F706F7574ull;  // "dropout"

// The file of this rank's parameter shard under optimizer.offload_params (ZeRO-3, nvme), with
// room checked for it and the optimizer state's 12 bytes per element of the shard.
std::unique_ptr<data_parallel::ParamFile> param_file(const config::Config& cfg, kernels::Ops& ops,
                                                     model::Gpt& model, int rank) {
    if (!cfg.optimizer.offload_params) return nullptr;
    model::FlatBuffer& params = model.params();
    return std::make_unique<data_parallel::ParamFile>(ops, params, *cfg.optimizer.offload_dir, rank,
                                                      12ull * params.shard_size());
}

}  // namespace

Trainer::Trainer(const config::Config& cfg, kernels::Ops& ops, parallel::Grid& grid)
    : cfg_(cfg),
      ops_(ops),
      grid_(grid),
      tensor_(grid.tensor()),
      pipeline_(grid.pipeline()),
      embedding_(grid.embedding()),
      data_(grid.data()),
      context_(grid.context()),
      data_context_(grid.data_context()),
      model_(ops,
             gpt_options(cfg, grid.coordinates().pp, grid.data_shard().size(),
                         grid.data_shard().rank()),
             model::ModelGroups{tensor_, context_, grid.kv_replicas()}),
      param_file_(param_file(cfg, ops, model_, grid.rank())),
      // The replicas of the weights are the D·C ranks of the data-context group: the
      // gradients are summed and the optimizer state sharded over all of them, as Megatron-Core
      // does; with hybrid sharding, over each run of data_shard of them and summed across the
      // runs (data_parallel.h). What trains: every parameter, or the adapters of a frozen model
      // (whose parameters' gathers after the update are too small to overlap with anything).
      data_parallel_(ops, model_.trainable_layout(), model_.trainable_params(),
                     model_.trainable_grads(), grid.data_shard(), grid.data_replica(),
                     cfg.parallel.zero_stage, static_cast<std::size_t>(cfg.parallel.bucket_size),
                     data_parallel::Overlap{cfg.parallel.overlap_grad_reduce,
                                            cfg.parallel.overlap_param_gather && !model_.frozen()},
                     data_parallel::Resharding{cfg.parallel.reshard_after_forward},
                     param_file_.get()),
      optimizer_(ops, model_.trainable_layout(), cfg.training, cfg.optimizer, grid.rank(),
                 data_parallel_, optim::NormGroups{tensor_, pipeline_}, model_.trainable_params(),
                 model_.trainable_grads()),
      scaler_(cfg.training),
      guard_(cfg.training),
      sighting_(ops, grid, tensor_, pipeline_, data_context_),
      executor_(ops, model_, pipeline_) {
    model_.set_split_backward(pipeline::splits_backward(cfg.parallel.schedule));
    executor_.set_trace(&trace_);
    model_.set_piece_trace([this](const model::PieceSpan& s) {
        if (!trace_.recording()) return;
        if (s.transfer)
            trace_.add_transfer(io::SpanKind::tp_exchange, s.block,
                                parallel::Request::Transfer{s.thread, s.start_us, s.end_us},
                                s.issued_us);
        else
            trace_.add(io::SpanKind::tp_gemm, -1, s.block, s.start_us, s.end_us);
    });
    data_parallel_.set_trace(&trace_);
    data_parallel::DataParallel& dp = data_parallel_;
    model::Gpt::StepHooks hooks{[this](std::size_t b, std::size_t e) { this->grads_final(b, e); },
                                [&dp](std::size_t b, std::size_t e) { dp.params_needed(b, e); },
                                [&dp](std::size_t b, std::size_t e) { dp.params_prefetch(b, e); },
                                [&dp](std::size_t b, std::size_t e) { dp.params_done(b, e); },
                                [&dp](std::size_t b, std::size_t e) { dp.grads_needed(b, e); },
                                {},
                                {},
                                {}};
    // ZeRO-3 shards a frozen model's own parameters too: each unit is gathered for the forward
    // and the backward and released, as the adapters' are; having no gradients, it is never
    // reduced.
    if (model_.frozen() && cfg.parallel.zero_stage == 3) {
        frozen_units_ = std::make_unique<data_parallel::ZeroUnits>(
            ops, model_.params(), model_.grads(), grid.data_shard(), false,
            cfg.parallel.overlap_param_gather && grid.data_shard().size() > 1,
            cfg.parallel.reshard_after_forward);
        frozen_units_->set_trace(&trace_);
        data_parallel::ZeroUnits& base = *frozen_units_;
        hooks.frozen_needed = [&base](std::size_t b, std::size_t e) { base.params_needed(b, e); };
        hooks.frozen_prefetch = [&base](std::size_t b, std::size_t e) {
            base.params_prefetch(b, e);
        };
        hooks.frozen_done = [&base](std::size_t b, std::size_t e) { base.params_done(b, e); };
    }
    model_.set_hooks(hooks);
}

MemoryUse Trainer::memory() const {
    MemoryUse m;
    m.parameters = model_.params_bytes() + model_.lora_params().bytes();
    m.gradients = model_.grads_bytes() + model_.lora_grads().bytes();
    m.optimizer = optimizer_.state_bytes();
    m.activations = model_.activation_bytes();
    m.peak = ops_.peak_allocated_bytes();
    return m;
}

void Trainer::grads_final(std::size_t begin, std::size_t end) {
    // Sharded gradients (ZeRO 2 and 3) are whole unit by unit, each in its own allocation.
    const model::FlatBuffer& grads = model_.trainable_grads();
    if (!grads.sharded()) {
        sighting_.grads_final(grads.at(begin), end - begin);
    } else {
        const auto [first, last] = grads.units_of(begin, end);
        for (std::size_t u = first; u < last; ++u) {
            const std::size_t lo = std::max(begin, grads.units()[u].first),
                              hi = std::min(end, grads.units()[u].second);
            if (lo < hi && grads.resident(u)) sighting_.grads_final(grads.at(lo), hi - lo);
        }
    }
    data_parallel_.grads_final(begin, end);
}

void Trainer::tie_sharded_embedding() {
    const model::StagePlan& plan = model_.layout().plan();
    model::FlatBuffer& grads = model_.grads();
    if (plan.first() == plan.last() || !grads.sharded() || !model_.shape().tied) return;
    // The first and the last stage hold the same wte unit, split alike over their replicas.
    const std::size_t u = grads.units_of(model_.layout().wte(), model_.layout().wte() + 1).first;
    embedding_.all_reduce(grads.shard_part(u), grads.part_size(u));
}

void Trainer::release_gathered_params() {
    data_parallel_.release_params();
    if (frozen_units_) frozen_units_->release_params();
}

double Trainer::from_last_stage(double loss) {
    const model::ChunkMap map = model_.layout().plan().map();
    pipeline_.broadcast(&loss, 1, map.stage_of(map.last()));
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
    before_gathers();
    const double loss_sum = executor_.run(
        pipeline::schedule(cfg_.parallel.schedule, plan.stages, plan.chunks, microbatches,
                           plan.stage),
        [&](int mb, std::span<int32_t> in, std::span<int32_t> tgt) {
            fill_microbatch(sample, first_of(mb), in, tgt);
        },
        dloss, true,
        [&](int mb) { return kernels::hash64(t.seed ^ kDropoutStream, first_of(mb)); });
    release_gathered_params();
    after_gathers();
    // The LM head's copy of wte on the last stage and the embedding's on the first: the
    // tied weight's gradient is the sum of both, and final then (sharded gradients: summed
    // on the shards once reduced, tie_sharded_embedding). With the head on the first stage
    // (ZB-V) both were added there and the embedding group is this rank alone.
    if (plan.stages > 1 && (plan.first() || plan.last()) && !model_.grads().sharded() &&
        !model_.frozen() && model_.shape().tied) {
        const model::ParamTensor* wte = model_.layout().find(model_.layout().wte_name());
        embedding_.all_reduce(model_.grads().at(wte->offset), wte->numel);
        grads_final(wte->offset, wte->offset + wte->numel);
    }
    sighting_.own_loss(loss_sum);
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
    for (parallel::Comm* data : grid_.data_groups()) data->reset_stats();
    grid_.kv_replicas().reset_stats();
    pipeline_.reset_stats();
    embedding_.reset_stats();
    StepResult r;
    const int64_t param_read = param_file_ ? static_cast<int64_t>(param_file_->bytes_read()) : 0,
                  param_written =
                      param_file_ ? static_cast<int64_t>(param_file_->bytes_written()) : 0;
    r.loss_scale = scaler_.scale();
    sighting_.start_step(step + 1);
    data_parallel_.start_step();  // buckets reduce as the backward completes them
    r.loss = accumulate_gradients(step, sample, r.loss_scale);
    data_parallel_.reduce_gradients();
    tie_sharded_embedding();
    // The norm of the scaled gradients, the same on every rank: inf or NaN everywhere if
    // any gradient overflowed anywhere, so every rank takes the same decision.
    const double scaled_norm = optimizer_.grad_norm();
    r.grad_norm = scaled_norm / r.loss_scale;
    r.lr = optim::learning_rate(cfg_.training, step);
    // fp16's overflows are the loss scaler's; every other verdict the guard's.
    Verdict verdict{false, "overflow", ""};
    if (scaler_.update(std::isfinite(scaled_norm) && std::isfinite(r.loss), step + 1))
        verdict = guard_.judge(step + 1, r.loss, r.grad_norm, [&] { return sighting_.find(); });
    r.skipped = !verdict.apply;
    r.skip_reason = verdict.reason;
    r.skip_note = verdict.note;
    const optim::OffloadStore* store = optimizer_.store();
    const int64_t read_before = store ? static_cast<int64_t>(store->bytes_read()) : 0,
                  written_before = store ? static_cast<int64_t>(store->bytes_written()) : 0;
    if (!r.skipped) {
        const io::ScopedSpan span(&trace_, io::SpanKind::optimizer, -1, -1);
        const double factor = optimizer_.clip_factor(r.grad_norm) / r.loss_scale;
        data_parallel_.finish_param_gather();  // the previous update's, if the forward left any
        step_optimizer(r.lr, static_cast<float>(factor));
        data_parallel_.gather_updated();
    }
    if (store) {
        r.offload_read = static_cast<int64_t>(store->bytes_read()) - read_before;
        r.offload_written = static_cast<int64_t>(store->bytes_written()) - written_before;
    }
    if (param_file_) {
        r.offload_param_read = static_cast<int64_t>(param_file_->bytes_read()) - param_read;
        r.offload_param_written =
            static_cast<int64_t>(param_file_->bytes_written()) - param_written;
    }
    r.tensor_comm = tensor_.stats();
    r.context_comm = context_.stats();
    // The data-parallel traffic: the exchange's (over the shard group, and with hybrid
    // sharding its replicas) and the loss's.
    for (const parallel::Comm* data : grid_.data_groups()) r.data_comm += data->stats();
    r.kv_replica_comm = grid_.kv_replicas().stats();
    r.pipeline_comm = pipeline_.stats();
    r.embedding_comm = embedding_.stats();
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
    before_gathers();
    const double loss_sum = executor_.run(
        pipeline::forward_only(model_.layout().plan(), microbatches),
        [&](int mb, std::span<int32_t> in, std::span<int32_t> tgt) {
            fill_microbatch(sample, first_sample + static_cast<uint64_t>(mb) * t.micro_batch, in,
                            tgt);
        },
        0.0f, false, [](int) { return uint64_t{0}; });
    release_gathered_params();
    after_gathers();
    // The mean of the replicas' and context ranks' means (equal token counts).
    double loss = from_last_stage(loss_sum / microbatches);
    data_context_.all_reduce(&loss, 1);
    return loss / data_context_.size();
}

std::vector<float> Trainer::local(std::vector<float> (model::Gpt::*to_host)() const,
                                  const model::FlatBuffer& buffer) {
    data_parallel_.finish_param_gather();
    std::vector<float> host;
    if (&buffer == &model_.params() && param_file_)
        agree_on_offload([&] { on_held_shard(false, [&] { host = (model_.*to_host)(); }); });
    else
        host = (model_.*to_host)();
    // Sharded, each element is on one rank of the shard group and zero on the others.
    if (buffer.sharded()) grid_.data_shard().all_reduce(host.data(), host.size());
    return host;
}

std::vector<float> Trainer::local_params() {
    if (model_.frozen()) return local(&model::Gpt::lora_to_host, model_.lora_params());
    return local_model_params();
}

std::vector<float> Trainer::local_model_params() {
    return local(&model::Gpt::params_to_host, model_.params());
}

std::vector<float> Trainer::gather_full(std::vector<float> (model::Gpt::*to_host)() const,
                                        const model::FlatBuffer& buffer) {
    const std::vector<float> local_part = local(to_host, buffer);
    const bool adapters = &buffer == &model_.lora_params() || &buffer == &model_.lora_grads();
    std::vector<float> full =
        adapters ? model_.lora_share_of_full(local_part) : model_.share_of_full(local_part);
    tensor_.all_reduce(full.data(), full.size());
    pipeline_.all_reduce(full.data(), full.size());
    return full;
}

std::vector<float> Trainer::full_params() {
    std::vector<float> full = gather_full(&model::Gpt::params_to_host, model_.params());
    if (!model_.frozen()) return full;
    const std::vector<float> adapters =
        gather_full(&model::Gpt::lora_to_host, model_.lora_params());
    const model::GptShape& shape = model_.shape();
    model::merge_lora(model::ParamLayout(shape), full.data(),
                      model::ParamLayout::for_lora(shape, model_.lora().shape), adapters.data(),
                      model_.lora().scale);
    return full;
}

std::vector<float> Trainer::full_lora_grads() {
    return gather_full(&model::Gpt::lora_grads_to_host, model_.lora_grads());
}

std::vector<float> Trainer::full_grads() {
    return gather_full(&model::Gpt::grads_to_host, model_.grads());
}

void Trainer::agree_on_offload(const std::function<void()>& work) {
    if (!optimizer_.store()) return work();
    std::string error;
    try {
        work();
    } catch (const optim::OffloadError& e) {
        error = e.what();
    }
    // Every rank learns whether any rank's state file failed, and stops with it: the groups
    // of the data-context, tensor and pipeline ranks together span the grid.
    for (parallel::Comm* group : {&data_context_, &tensor_, &pipeline_})
        error = parallel::first_failure(*group, error);
    if (!error.empty()) throw TrainingStopped(error);
}

void Trainer::before_gathers() {
    if (!param_file_) return;
    agree_on_offload([&] {
        if (model_.params().shard_held()) param_file_->let_go_shard(false);
        param_file_->check();
    });
}

void Trainer::after_gathers() {
    if (param_file_) agree_on_offload([&] { param_file_->check(); });
}

void Trainer::on_held_shard(bool changes, const std::function<void()>& work) {
    if (!param_file_) return work();
    const bool held = model_.params().shard_held();  // not yet moved to the file
    if (!held) param_file_->hold_shard();
    work();
    if (!held || changes) param_file_->let_go_shard(!changes);
}

void Trainer::step_optimizer(double lr, float factor) {
    agree_on_offload([&] { optimizer_.step(lr, factor); });
}

optim::AdamW::State Trainer::optimizer_state() {
    optim::AdamW::State state;
    // Before the first update the master weights are the parameters (ZeRO-3: the shard).
    agree_on_offload([&] { on_held_shard(false, [&] { state = optimizer_.state(); }); });
    return state;
}

void Trainer::restore_optimizer(const optim::AdamW::State& state) {
    data_parallel_.finish_param_gather();
    agree_on_offload([&] {
        on_held_shard(true, [&] {
            optimizer_.restore(state);
            optimizer_.params_from_master();
        });
    });
    data_parallel_.gather_params();  // collective
}

void Trainer::write_trace(const std::string& path) {
    // Data-parallel replicas and context ranks run the same schedule: the first one's trace
    // (dp 0, cp 0) stands for all. A track per (stage, tensor rank), named by its world rank.
    std::vector<std::string> names;
    for (int pp = 0; pp < pipeline_.size(); ++pp)
        for (int tp = 0; tp < tensor_.size(); ++tp)
            names.push_back("rank " +
                            std::to_string(parallel::rank_of(grid_.shape(), {pp, 0, tp, 0})) +
                            ": stage " + std::to_string(pp) + ", tensor " + std::to_string(tp));
    if (data_.rank() == 0 && context_.rank() == 0) trace_.write(path, tensor_, pipeline_, names);
}

}  // namespace trident::train
