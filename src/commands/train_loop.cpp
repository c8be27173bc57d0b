// The training loop of `trident train` (see train_loop.h).
#include "commands/train_loop.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <functional>

#include "commands/stage_memory.h"
#include "io/fault_injection.h"
#include "kernels/error.h"
#include "parallel/agreement.h"
#include "train/preemption.h"
#include "train/replica_check.h"

namespace trident::commands {

std::string newest_checkpoint(const config::Config& cfg) {
    const auto all = train::list_checkpoints(*cfg.checkpoint.dir);
    return all.empty() ? "no checkpoint has been written to " + *cfg.checkpoint.dir
                       : all.back() + " is the newest checkpoint, as it was";
}

namespace {

const char* signal_name(int signal) {
    return signal == SIGTERM   ? "SIGTERM"
           : signal == SIGUSR1 ? "SIGUSR1"
           : signal == SIGINT  ? "SIGINT"
                               : "a signal";
}

bool due(int step, int interval, int steps) {
    return step == steps || (interval > 0 && step % interval == 0);
}

// checkpoint.dir/step_NNNNNN.
std::string async_dir(const config::Config& cfg, int step) {
    return (std::filesystem::path(*cfg.checkpoint.dir) / train::checkpoint_name(step)).string();
}

// "; " and the newest checkpoint, or that none is written.
std::string newest_or_none(const config::Config& cfg) {
    return "; " + (cfg.checkpoint.dir ? newest_checkpoint(cfg)
                                      : std::string("no checkpoint (checkpoint.dir is not set)"));
}

// A stop every rank agreed on (the step guard's, or a failed optimizer-state file), with the
// newest checkpoint named.
EveryRankError stopped(const config::Config& cfg, const train::TrainingStopped& e) {
    return EveryRankError(std::string(e.what()) + newest_or_none(cfg));
}

// A failed save (or commit) of `step`, as checkpoint.on_error says: "" where training goes
// on (said by rank 0), which only a save with a later one to come may; the last step's, or a
// preemption's (`last`), ends the run with the error like `stop`.
std::string failed_save(const config::Config& cfg, const train::CheckpointError& e, int step,
                        bool last, bool leader) {
    const bool go_on = cfg.checkpoint.on_error == config::OnError::continue_ && !last;
    const std::string text = std::string(e.what()) + "; " + newest_checkpoint(cfg);
    if (!go_on) throw EveryRankError(text + (last ? "" : " (checkpoint.on_error: stop)"));
    if (leader) {
        std::fprintf(stderr,
                     "trident: warning: %s; training goes on and saves again at step %d "
                     "(checkpoint.on_error: continue)\n",
                     text.c_str(), std::min(step + cfg.checkpoint.interval, cfg.training.steps));
        std::fflush(stderr);
    }
    return "";
}

// The pending asynchronous save committed (collective), after step `step`: its directory, or
// "" where there is none or it failed and training goes on.
std::string commit_pending(const config::Config& cfg, train::AsyncCheckpoint& async,
                           parallel::World& world, int step, bool last, bool leader) {
    if (!async.pending()) return "";
    try {
        const std::string dir = async.finish(world.comm());
        if (leader) std::printf("checkpoint: %s\n", dir.c_str());
        return dir;
    } catch (const train::CheckpointError& e) {
        return failed_save(cfg, e, step, last, leader);
    }
}

// Saves the checkpoint of `step`, or with checkpoint.async begins to (but the last step's or
// a preemption's, `last`, which is written at once), once the previous one is committed.
// Returns its directory, or "" where the save failed and training goes on.
std::string save_or_report(const config::Config& cfg, train::Trainer& trainer, parallel::Grid& grid,
                           parallel::World& world, train::AsyncCheckpoint& async, int step,
                           int skipped, const std::vector<train::DataFileRecord>& data,
                           const train::LoraRecord& lora, bool last, bool leader) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto held = [&] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    commit_pending(cfg, async, world, step, last, leader);
    try {
        if (cfg.checkpoint.async && !last) {
            async.start(
                train::begin_save(cfg, trainer, grid, world.comm(), step, skipped, data, lora));
            const std::string dir = async_dir(cfg, step);
            if (leader)
                std::printf(
                    "checkpoint: %s being written in the background (training held %.2f s)\n",
                    dir.c_str(), held());
            return dir;
        }
        const std::string dir =
            train::save_checkpoint(cfg, trainer, grid, world.comm(), step, skipped, data, lora);
        if (leader) std::printf("checkpoint: %s (training held %.2f s)\n", dir.c_str(), held());
        return dir;
    } catch (const train::CheckpointError& e) {
        return failed_save(cfg, e, step, last, leader);
    } catch (const train::TrainingStopped& e) {
        throw stopped(cfg, e);
    }
}

// Rank 0's write of a record (`what`: "step 5") to the metrics file; a failed write ends the
// run after this step (logging.on_error: stop, the message kept for then) or is reported and
// passed over.
void record_metrics(const std::function<void()>& write, const std::string& what,
                    const config::Config& cfg, std::string& failure) {
    try {
        write();
    } catch (const Error& e) {
        if (cfg.logging.on_error == config::OnError::stop) {
            failure = std::string(e.what()) + " (logging.on_error: stop)";
            return;
        }
        std::fprintf(stderr,
                     "trident: warning: %s; %s is not in it, training goes on "
                     "(logging.on_error: continue)\n",
                     e.what(), what.c_str());
        std::fflush(stderr);
    }
}

// Step `s`; a stop the step guard calls for (the same on every rank) ends the run with its
// message and the newest checkpoint named.
train::StepResult step_or_stop(const config::Config& cfg, train::Trainer& trainer, int s,
                               const train::SampleFn& sample) {
    try {
        return trainer.step(s, sample);
    } catch (const train::TrainingStopped& e) {
        throw stopped(cfg, e);
    }
}

// The metrics file, opened by rank 0 alone: every rank learns whether it could be.
std::optional<train::MetricsLog> open_metrics(const config::Config& cfg, int start,
                                              parallel::World& world, bool leader) {
    std::optional<train::MetricsLog> log;
    std::string log_error;
    try {
        if (leader)
            log.emplace(cfg.logging.metrics, cfg.logging.interval,
                        start > 0 ? std::optional<int>(start) : std::nullopt,
                        cfg.logging.tensorboard);
        if (log && !log->note().empty()) std::printf("%s\n", log->note().c_str());
    } catch (const Error& e) {
        log_error = e.what();
    }
    if (const std::string e = parallel::first_failure(world.comm(), log_error); !e.empty())
        throw EveryRankError(e);
    return log;
}

}  // namespace

Loop::Loop(const Setup& setup, parallel::Grid& grid, parallel::World& world,
           train::Trainer& trainer, const train::LoraRecord& lora, const Peak& peak, Start start)
    : setup_(setup),
      cfg_(setup.cfg),
      grid_(grid),
      world_(world),
      trainer_(trainer),
      lora_(lora),
      peak_(peak),
      leader_(grid.rank() == 0),
      start_(start.step),
      skipped_so_far_(start.skipped_total) {
    if (cfg_.training.straggler_factor > 0)
        stragglers_.emplace(cfg_.training.straggler_factor, grid.shape(), world.comm());
}

bool Loop::run() {
    log_ = open_metrics(cfg_, start_, world_, leader_);
    if (setup_.valid_data) validate_first();
    if (stop_before_first_step()) return false;
    for (int s = start_; s < cfg_.training.steps; ++s)
        if (!step(s)) return false;
    return true;
}

// A signal that came during the start-up (a resume's reads, the validation) stops the run
// before its first step, on every rank: nothing has changed since the start to be saved.
bool Loop::stop_before_first_step() {
    int32_t signal = train::preemption_signal();
    world_.comm().all_reduce(&signal, 1, parallel::ReduceOp::max);
    if (signal == 0) return false;
    signal_ = signal;
    if (leader_)
        std::printf(
            "trident: preempted by %s (%d) before step %d of %d: nothing trained, "
            "nothing to save%s\n",
            signal_name(signal), signal, start_ + 1, cfg_.training.steps,
            newest_or_none(cfg_).c_str());
    return true;
}

// Rank 0's lock file of checkpoint.dir still there: a directory removed under the run (rm -rf)
// took its checkpoints, its lock and its metrics file with it, and a save would only make a
// directory no run guards. Every rank stops together, before the save. Collective.
void Loop::check_dir_kept(int step) {
    std::string lost;
    if (setup_.dir_lock && !setup_.dir_lock->still_held())
        lost = "checkpoint.dir: '" + *cfg_.checkpoint.dir +
               "' was removed or replaced during the run (its lock file is gone, and with it "
               "the run's earlier checkpoints and the metrics beside them): training stopped "
               "after step " +
               std::to_string(step) + " without saving; restore it, or start afresh";
    lost = parallel::first_failure(world_.comm(), lost);
    if (!lost.empty()) throw EveryRankError(lost);
}

std::string Loop::save(int step, bool last) {
    return save_or_report(cfg_, trainer_, grid_, world_, async_, step, skipped_so_far_,
                          setup_.data_files, lora_, last, leader_);
}

void Loop::validate_first() {
    first_val_ = last_val_ = trainer_.evaluate(valid_sample_, cfg_.training.eval_sequences);
    if (leader_)
        std::printf("step %5d/%d | val_loss %.4f (%s)\n", start_, cfg_.training.steps, first_val_,
                    start_ > 0 ? "at resume" : "before training");
    // As step 0 of the metrics file (a resumed run's goes on from its checkpoint's step).
    std::string failure;
    if (log_ && start_ == 0)
        record_metrics([&] { log_->record_validation(0, first_val_); },
                       "the validation before training", cfg_, failure);
    if (const std::string e = parallel::first_failure(world_.comm(), failure); !e.empty())
        throw EveryRankError(e);
}

bool Loop::step(int s) {
    const auto& lg = cfg_.logging;
    {
        parallel::set_step(s + 1);
        const parallel::ScopedPhase phase(parallel::Phase::training);
        io::fault::at_step(s + 1, world_.rank());
    }
    trainer_.trace().set_recording(lg.trace && s + 1 >= lg.trace_from &&
                                   s + 1 < lg.trace_from + lg.trace_steps);
    const train::StepResult r = step_or_stop(cfg_, trainer_, s, train_sample_);
    trainer_.trace().set_recording(false);
    if (leader_ && !r.skip_note.empty()) {
        std::fprintf(stderr, "trident: warning: %s\n", r.skip_note.c_str());
        std::fflush(stderr);
    }
    for (const std::string& line : collapse_.observe(s + 1, r.moe_loads))
        if (leader_) std::fprintf(stderr, "trident: warning: %s\n", line.c_str());
    if (leader_ && r.nothing_counted && !said_nothing_counted_) {
        said_nothing_counted_ = true;
        std::printf(
            "note: step %d: no position of the global batch counts a loss (every input "
            "token is data.eod_token under data.mask_eod_loss): no loss and no gradient, "
            "said once for every such step\n",
            s + 1);
    }
    train::StepMetrics m = metrics_of(s, r);
    if (setup_.valid_data && due(m.step, cfg_.training.eval_interval, cfg_.training.steps)) {
        m.val_loss = trainer_.evaluate(valid_sample_, cfg_.training.eval_sequences);
        last_val_ = *m.val_loss;
    }
    std::string metrics_failure;
    if (log_)
        record_metrics([&] { log_->record(m); }, "step " + std::to_string(m.step), cfg_,
                       metrics_failure);
    if (stragglers_ && s == start_) stragglers_->begin_after(m.step);
    if (stragglers_ && m.step % lg.interval == 0 && s > start_)
        for (const std::string& line : stragglers_->report(m.step))
            if (leader_) std::printf("%s\n", line.c_str());
    check_health(m);
    std::string saved;  // this step's checkpoint, saved or begun
    if (cfg_.checkpoint.dir && due(m.step, cfg_.checkpoint.interval, cfg_.training.steps)) {
        check_dir_kept(m.step);
        saved = save(m.step, m.step == cfg_.training.steps);
    }
    return stop_together(m, metrics_failure, saved);
}

// The step's figures for the log and the metrics file.
train::StepMetrics Loop::metrics_of(int s, const train::StepResult& r) {
    const config::Derived& d = cfg_.derived;
    train::StepMetrics m;
    m.step = s + 1;
    m.steps = cfg_.training.steps;
    if (s == start_ && start_ > 0) m.resumed_at = start_;
    m.loss = r.loss;
    m.lr = r.lr;
    m.grad_norm = r.grad_norm;
    if (cfg_.model.moe.enabled()) {
        m.moe_aux_loss = r.moe_aux_loss;
        m.moe_z_loss = r.moe_z_loss;
        m.moe_loads = r.moe_loads;
    }
    m.loss_scale = r.loss_scale;
    m.skipped = r.skipped;
    m.skip_reason = r.skip_reason;
    skipped_so_far_ += r.skipped;
    m.skipped_total = skipped_so_far_;
    step_times_.add(r.seconds);
    m.eta_s = step_times_.seconds_left(m.steps - m.step);
    m.tensor_comm = r.tensor_comm;
    m.activation_sets = static_cast<int64_t>(r.activation_sets);
    m.documents_per_window = r.documents_per_window;
    m.data_comm = r.data_comm;
    m.context_comm = r.context_comm;
    m.kv_replica_comm = r.kv_replica_comm;
    m.expert_comm = r.expert_comm;
    m.pipeline_comm = r.pipeline_comm;
    m.embedding_comm = r.embedding_comm;
    m.mem_params = static_cast<int64_t>(r.memory.parameters);
    m.mem_grads = static_cast<int64_t>(r.memory.gradients);
    m.mem_optimizer = static_cast<int64_t>(r.memory.optimizer);
    m.mem_activations = static_cast<int64_t>(r.memory.activations);
    m.mem_peak = static_cast<int64_t>(r.memory.peak);
    m.offload_read = r.offload_read;
    m.offload_written = r.offload_written;
    m.offload_param_read = r.offload_param_read;
    m.offload_param_written = r.offload_param_written;
    m.mem_stages = memory_of_stages(r.memory, grid_, world_);  // collective
    m.step_ms = 1e3 * r.seconds;
    m.tokens_per_s = static_cast<double>(d.tokens_per_step) / r.seconds;
    // FLOP/s per process, as the papers count per GPU.
    const double flops = d.flops_per_step / r.seconds / d.world_size;
    m.tflops = flops / 1e12;
    m.mfu = flops / peak_.flops;
    return m;
}

// The replicas compared every training.check_replicas steps: a difference ends the run.
void Loop::check_health(const train::StepMetrics& m) {
    const int every = cfg_.training.check_replicas;
    if (every <= 0 || m.step % every != 0) return;
    std::string differ;
    try {
        differ = train::check_replicas(cfg_, trainer_, grid_, world_.comm(), m.step);
    } catch (const train::TrainingStopped& e) {
        throw stopped(cfg_, e);
    }
    if (!differ.empty()) throw EveryRankError(differ + "; training stopped" + newest_or_none(cfg_));
}

// A signal on any rank, or a failed write of rank 0's metrics, stops every rank here, after
// the same step; an asynchronous save every rank has written is committed. False: stopped by
// a signal (`saved`: this step's checkpoint, saved or begun).
bool Loop::stop_together(const train::StepMetrics& m, const std::string& metrics_failure,
                         std::string saved) {
    int32_t stop[3] = {train::preemption_signal(), metrics_failure.empty() ? 0 : 1,
                       async_.writing() ? 1 : 0};
    world_.comm().all_reduce(stop, 3, parallel::ReduceOp::max);
    if (stop[1] != 0)
        throw EveryRankError(leader_ ? metrics_failure + "; " +
                                           (cfg_.checkpoint.dir ? newest_checkpoint(cfg_)
                                                                : "checkpoint.dir is not set")
                                     : "the metrics file could not be written");
    if (stop[2] == 0 && async_.pending())
        commit_pending(cfg_, async_, world_, m.step, false, leader_);
    const int32_t signal = stop[0];
    if (signal == 0) return true;
    signal_ = signal;
    if (cfg_.checkpoint.dir && saved.empty()) {
        check_dir_kept(m.step);
        saved = save(m.step, true);
    } else if (async_.pending())
        saved = commit_pending(cfg_, async_, world_, m.step, true, leader_);
    if (leader_)
        std::printf("trident: preempted by %s (%d) after step %d of %d; %s\n", signal_name(signal),
                    signal, m.step, cfg_.training.steps,
                    saved.empty() ? "no checkpoint written (checkpoint.dir is not set)"
                                  : ("checkpoint written to " + saved).c_str());
    return false;
}

}  // namespace trident::commands
