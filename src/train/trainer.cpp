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
#include "train/token_loss.h"

namespace trident::train {

namespace {

// The trace's span of a compute piece run under an exchange (model/tensor_rows.h).
io::SpanKind piece_span(model::PieceKind kind) {
    switch (kind) {
        case model::PieceKind::tensor:
            return io::SpanKind::tp_gemm;
        case model::PieceKind::expert:
            return io::SpanKind::ep_shared;
        case model::PieceKind::expert_combine:
            return io::SpanKind::ep_wgrad;
        case model::PieceKind::attention_wgrad:
            break;
    }
    return io::SpanKind::ep_attention;
}

// Dropout seeds are a separate stream from initialisation's.
constexpr uint64_t kDropoutStream = 0x64726F706F7574ull;  // "dropout"

// The file of this rank's parameter shard under optimizer.offload_params (ZeRO-3, nvme), with
// room checked for it and the optimizer state's (AdamW: 12 bytes) per element of the shard.
std::unique_ptr<data_parallel::ParamFile> param_file(const config::Config& cfg, kernels::Ops& ops,
                                                     model::Gpt& model, int rank) {
    if (!cfg.optimizer.offload_params) return nullptr;
    model::FlatBuffer& params = model.weights().params();
    return std::make_unique<data_parallel::ParamFile>(
        ops, params, *cfg.optimizer.offload_dir, rank,
        optim::state_bytes(cfg.training, cfg.optimizer).most() * params.shard_size());
}

// The model as the data-parallel module sees it: what trains (every parameter, or a frozen
// model's adapters) and a frozen model's own parameters.
data_parallel::ModelBuffers model_buffers(model::Gpt& model) {
    model::WeightSet& trainable = model.trainable();
    return {model.units(),
            trainable.params(),
            trainable.grads(),
            trainable.layout().total(),
            trainable.layout().expert_runs(),
            model.frozen() ? &model.weights().params() : nullptr,
            model.nf4_base() ? &model.nf4_base()->codes() : nullptr};
}

data_parallel::DataParallelOptions data_options(const config::ParallelConfig& p) {
    return {p.zero_stage, static_cast<std::size_t>(p.bucket_size),
            data_parallel::Overlap{p.overlap_grad_reduce, p.overlap_param_gather},
            data_parallel::Resharding{p.reshard_after_forward}};
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
      // The replicas of the weights are the D·C ranks of the data-context group: the
      // gradients are summed and the optimizer state sharded over all of them, as Megatron-Core
      // does; with hybrid sharding, over each run of data_shard of them and summed across the
      // runs (data_parallel.h).
      model_(ops,
             gpt_options(
                 cfg, grid.coordinates().pp,
                 data_parallel::buffer_plan(cfg.parallel.zero_stage, grid.data_shard(),
                                            grid.expert_shard(), cfg.parallel.sharded_accumulation),
                 grid.group(parallel::Group::expert).rank()),
             model::ModelGroups{tensor_, context_, grid.kv_replicas(),
                                &grid.group(parallel::Group::expert)}),
      param_file_(param_file(cfg, ops, model_, grid.rank())),
      data_parallel_(ops, model_buffers(model_),
                     data_parallel::DataGroups{grid.data_shard(), grid.data_replica(), embedding_,
                                               grid.expert_shard()},
                     data_options(cfg.parallel), param_file_.get()),
      optimizer_(ops, model_.trainable().layout(), cfg.training, cfg.optimizer, grid.rank(),
                 data_parallel_, tensor_, model_.trainable().params(), model_.trainable().grads()),
      grad_norm_(ops, optimizer_.ranges(), model_.trainable().grads(), data_parallel_,
                 optim::NormGroups{tensor_, pipeline_, grid.group(parallel::Group::expert)}),
      scaler_(cfg.training),
      guard_(cfg.training),
      sighting_(ops, grid, tensor_, pipeline_, data_context_),
      executor_(ops, model_, pipeline_),
      balance_(cfg.model.moe, model_.trainable().layout()) {
    executor_.set_trace(&trace_);
    model_.set_piece_trace([this](const model::PieceSpan& s) {
        if (!trace_.recording()) return;
        const bool tensor = s.kind == model::PieceKind::tensor;
        if (s.transfer)
            trace_.add_transfer(
                tensor ? io::SpanKind::tp_exchange : io::SpanKind::ep_exchange, s.block,
                parallel::Request::Transfer{s.thread, s.start_us, s.end_us}, s.issued_us);
        else
            trace_.add(piece_span(s.kind), -1, s.block, s.start_us, s.end_us);
    });
    data_parallel_.set_trace(&trace_);
    // The model tells the data-parallel module of its units; it shows the first sighting each
    // range of gradients before it reduces it.
    model_.set_listener(&data_parallel_);
    data_parallel_.observe(&sighting_);
}

MemoryUse Trainer::memory() const {
    MemoryUse m;
    m.parameters = model_.weights().params().bytes() + model_.adapters().params().bytes();
    m.gradients = model_.weights().grads().bytes() + model_.adapters().grads().bytes();
    m.optimizer = optimizer_.state_bytes();
    m.activations = model_.activations().bytes;
    m.peak = ops_.peak_allocated_bytes();
    // A 4-bit base's codes and constants, and the tile it dequantizes into, are parameters.
    if (const model::Nf4Base* base = model_.nf4_base()) {
        m.parameters += base->bytes() + base->tile_bytes();
        m.quantized = base->bytes();
        m.quantized_parameters = base->parameters();
        m.tile = base->tile_bytes();
    }
    return m;
}

double Trainer::from_last_stage(double loss) {
    const model::ChunkMap map = model_.layout().plan().map();
    pipeline_.broadcast(&loss, 1, map.stage_of(map.last()));
    return loss;
}

double Trainer::token_loss(double loss_sum, double counted) {
    // Each microbatch added the mean of its rows' losses, the uncounted ones 0.
    const double rows = static_cast<double>(cfg_.training.micro_batch) * model_.local_tokens();
    double sum = from_last_stage(loss_sum) * rows;
    data_context_.all_reduce(&sum, 1);
    return counted > 0 ? sum / counted : 0.0;
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
    // The positions whose loss counts (train/token_loss.h): every token of the global batch,
    // unless eod inputs drop theirs.
    const bool per_token = per_token_loss(cfg_);
    const BatchCounts counts =
        count_batch(cfg_, sample, static_cast<uint64_t>(step) * t.global_batch, t.global_batch,
                    whole_inputs_, whole_targets_);
    const double counted =
        per_token ? counts.counted : static_cast<double>(cfg_.derived.tokens_per_step);
    documents_per_window_ = counts.documents / t.global_batch;
    nothing_counted_ = counted == 0;
    // Each token's share of the loss, times the loss scale (fp16; 1 otherwise); none where no
    // position counts.
    const float dloss = counted > 0 ? static_cast<float>(loss_scale / counted) : 0.0f;
    const auto first_of = [&](int mb) {
        return first_sample + static_cast<uint64_t>(mb) * t.micro_batch;
    };

    model_.weights().grads().zero();
    model_.adapters().grads().zero();
    before_gathers();
    const double loss_sum = executor_.run(
        pipeline::schedule(cfg_.parallel.schedule, plan.stages, plan.chunks, microbatches,
                           plan.stage),
        [&](int mb, std::span<int32_t> in, std::span<int32_t> tgt) {
            fill_microbatch(sample, first_of(mb), in, tgt);
        },
        dloss, true,
        [&](int mb) { return kernels::hash64(t.seed ^ kDropoutStream, first_of(mb)); });
    data_parallel_.release_params();
    after_gathers();
    // The tied embedding's two copies, on the first stage and on the last (data_parallel.h).
    data_parallel_.backward_done();
    sighting_.own_loss(loss_sum);
    if (per_token) return token_loss(loss_sum, counted);
    // The step's loss: the mean of the means of the replicas and context ranks (equal token
    // counts).
    double loss = from_last_stage(loss_sum / microbatches);
    data_context_.all_reduce(&loss, 1);
    return loss / data_context_.size();
}

// The mixture of experts' losses and loads of the step's forwards: each stage's layers' summed
// over the pipeline, each replica's over the data-context group (context rank 0 counted them);
// the losses then the mean over the microbatches and replicas.
void Trainer::moe_losses(StepResult& r) {
    const model::MoeSettings& moe = cfg_.model.moe;
    if (!moe.enabled()) return;  // no exchange a dense model's traffic would count
    model::MoeLossSums sums = model_.take_moe_losses();
    const int layers = cfg_.model.layers;
    const std::size_t L = static_cast<std::size_t>(layers);
    sums.tokens.resize(L * static_cast<std::size_t>(moe.experts));
    sums.dropped.resize(L);
    // The losses, then the tokens (layers, experts), then the dropped choices (layers).
    std::vector<double> v = {sums.aux, sums.z};
    v.insert(v.end(), sums.tokens.begin(), sums.tokens.end());
    v.insert(v.end(), sums.dropped.begin(), sums.dropped.end());
    pipeline_.all_reduce(v.data(), v.size());
    data_context_.all_reduce(v.data(), v.size());
    const double replicas = data_context_.size() / context_.size();
    const double microbatches = cfg_.derived.grad_accum_steps;
    r.moe_aux_loss = v[0] / (replicas * microbatches);
    r.moe_z_loss = v[1] / (replicas * microbatches);
    const auto tokens = v.begin() + 2, dropped = v.end() - static_cast<std::ptrdiff_t>(L);
    r.moe_loads = moe_loads(moe, layers, std::vector<double>(tokens, dropped),
                            std::vector<double>(dropped, v.end()));
}

StepResult Trainer::step(int step, const SampleFn& sample) {
    const auto t0 = std::chrono::steady_clock::now();
    parallel::set_step(step + 1);
    const parallel::ScopedPhase phase(parallel::Phase::training);
    tensor_.reset_stats();
    context_.reset_stats();
    for (parallel::Comm* data : grid_.data_groups()) data->reset_stats();
    grid_.kv_replicas().reset_stats();
    grid_.group(parallel::Group::expert).reset_stats();
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
    moe_losses(r);
    data_parallel_.reduce_gradients();
    // The norm of the scaled gradients, the same on every rank: inf or NaN everywhere if
    // any gradient overflowed anywhere, so every rank takes the same decision.
    const double scaled_norm = grad_norm_.norm();
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
        const double factor =
            optim::clip_factor(cfg_.training.grad_clip, r.grad_norm) / r.loss_scale;
        data_parallel_.finish_param_gather();  // the previous update's, if the forward left any
        step_optimizer(r.lr, static_cast<float>(factor));
        // The router's bias moves with the update, before the gather shares what it changed.
        if (balance_.active()) balance_.apply(optimizer_, r.moe_loads);
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
    r.expert_comm = grid_.group(parallel::Group::expert).stats();
    r.pipeline_comm = pipeline_.stats();
    r.embedding_comm = embedding_.stats();
    r.memory = memory();
    r.activation_sets = model_.activations().sets;
    r.documents_per_window = documents_per_window_;
    r.nothing_counted = nothing_counted_;
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
    data_parallel_.release_params();
    after_gathers();
    if (per_token_loss(cfg_))
        return token_loss(
            loss_sum,
            count_batch(cfg_, sample, 0, sequences, whole_inputs_, whole_targets_).counted);
    // The mean of the replicas' and context ranks' means (equal token counts).
    double loss = from_last_stage(loss_sum / microbatches);
    data_context_.all_reduce(&loss, 1);
    return loss / data_context_.size();
}

std::vector<float> Trainer::local(const model::WeightSet& set, bool grads) {
    data_parallel_.finish_param_gather();
    std::vector<float> host;
    const auto read = [&] { host = grads ? set.grads_to_host() : set.params_to_host(); };
    if (!grads && &set.params() == &model_.weights().params() && param_file_)
        agree_on_offload([&] { on_held_shard(false, read); });
    else
        read();
    // Sharded, each element is on one rank of the shard group and zero on the others; an
    // element of a run of the experts held, on one rank of the expert-shard group.
    if ((grads ? set.grads() : set.params()).sharded()) {
        std::vector<float> experts;
        for (const auto& [begin, end] : set.layout().expert_runs()) {
            experts.insert(experts.end(), host.begin() + begin, host.begin() + end);
            std::fill(host.begin() + begin, host.begin() + end, 0.0f);
        }
        grid_.data_shard().all_reduce(host.data(), host.size());
        grid_.expert_shard().all_reduce(experts.data(), experts.size());
        std::size_t from = 0;
        for (const auto& [begin, end] : set.layout().expert_runs()) {
            std::copy_n(experts.begin() + static_cast<std::ptrdiff_t>(from), end - begin,
                        host.begin() + static_cast<std::ptrdiff_t>(begin));
            from += end - begin;
        }
    }
    // A 4-bit base's matrices are its codes, not the buffer's (model/nf4_base.h), gathered a
    // unit at a time where ZeRO-3 shards them.
    if (const model::Nf4Base* base = model_.nf4_base(); base && !grads && &set == &model_.weights())
        data_parallel_.with_codes_gathered(
            [&](const model::ModelUnit& unit) { base->fill(host, unit.frozen); });
    return host;
}

std::vector<float> Trainer::local_params() {
    return local(model_.trainable(), false);
}

std::vector<float> Trainer::local_model_params() {
    return local(model_.weights(), false);
}

std::vector<float> Trainer::gather_full(const model::WeightSet& set, bool grads) {
    std::vector<float> full = set.share_of_whole(local(set, grads));
    tensor_.all_reduce(full.data(), full.size());
    pipeline_.all_reduce(full.data(), full.size());
    // Split experts: each expert rank's own (model/param_layout.h).
    if (set.layout().plan().experts > 1)
        grid_.group(parallel::Group::expert).all_reduce(full.data(), full.size());
    return full;
}

std::vector<float> Trainer::full_params() {
    std::vector<float> full = gather_full(model_.weights(), false);
    if (!model_.frozen()) return full;
    const std::vector<float> adapters = gather_full(model_.adapters(), false);
    model::merge_lora(model_.weights().whole(), full.data(), model_.adapters().whole(),
                      adapters.data(), model_.options().lora.scale);
    return full;
}

std::vector<float> Trainer::full_lora_grads() {
    return gather_full(model_.adapters(), true);
}

std::vector<float> Trainer::full_grads() {
    return gather_full(model_.weights(), true);
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
        if (model_.weights().params().shard_held()) param_file_->let_go_shard(false);
        param_file_->check();
    });
}

void Trainer::after_gathers() {
    if (param_file_) agree_on_offload([&] { param_file_->check(); });
}

void Trainer::on_held_shard(bool changes, const std::function<void()>& work) {
    if (!param_file_) return work();
    const bool held = model_.weights().params().shard_held();  // not yet moved to the file
    if (!held) param_file_->hold_shard();
    work();
    if (!held || changes) param_file_->let_go_shard(!changes);
}

void Trainer::step_optimizer(double lr, float factor) {
    agree_on_offload([&] { optimizer_.step(lr, factor); });
}

optim::OptimizerState Trainer::optimizer_state() {
    optim::OptimizerState state;
    // Before the first update the master weights are the parameters (ZeRO-3: the shard).
    agree_on_offload([&] { on_held_shard(false, [&] { state = optimizer_.state(); }); });
    return state;
}

void Trainer::restore_optimizer(const optim::OptimizerState& state) {
    data_parallel_.finish_param_gather();
    agree_on_offload([&] {
        on_held_shard(true, [&] {
            optimizer_.restore(state, cfg_.checkpoint.allow_optimizer_change);
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
