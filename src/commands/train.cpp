// `trident train`: trains the configured model on its dataset, with validation, metrics,
// checkpoints, resuming and preemption, on every rank of the grid (rank 0 speaks for all).
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>

#include "commands/commands.h"
#include "commands/resume_changes.h"
#include "commands/session.h"
#include "commands/stage_memory.h"
#include "data/dataset.h"
#include "io/fault_injection.h"
#include "io/fingerprint.h"
#include "kernels/error.h"
#include "model/param_layout.h"
#include "parallel/agreement.h"
#include "parallel/grid.h"
#include "parallel/world.h"
#include "train/async_checkpoint.h"
#include "train/base_weights.h"
#include "train/checkpoint.h"
#include "train/directory_lock.h"
#include "train/metrics.h"
#include "train/preemption.h"
#include "train/replica_check.h"
#include "train/stragglers.h"
#include "train/trainer.h"

namespace trident::commands {

namespace {

// checkpoint.resume, checked before anything runs: `never` starts afresh and so refuses a
// checkpoint.dir that holds checkpoints (they are kept); a PATH must be a checkpoint.
void check_resume_setting(const config::Config& cfg) {
    const auto& ck = cfg.checkpoint;
    if (ck.resume == "never" && ck.dir) {
        const auto existing = train::list_checkpoints(*ck.dir);
        if (!existing.empty())
            throw Error(
                "checkpoint.dir: '" + *ck.dir + "' already holds checkpoints (" + existing.back() +
                ") and checkpoint.resume is never; resume them "
                "(checkpoint.resume: auto) or choose another checkpoint.dir so they are kept");
    }
    if (ck.resume != "never" && ck.resume != "auto" &&
        !std::filesystem::exists(std::filesystem::path(ck.resume) / train::kManifestName))
        throw Error("checkpoint.resume: '" + ck.resume + "' is not a checkpoint directory (no " +
                    train::kManifestName + "); give a step_* directory, auto or never");
}

// This rank's share of the checkpoint to resume from, agreed by every rank:
// checkpoint.resume's PATH, or with `auto` the newest in checkpoint.dir that every rank reads
// without fault (an unusable one is reported, with the first failing rank's reason, and the
// one before it tried); none to start afresh.
std::optional<train::CheckpointShare> resume_point(const config::Config& cfg,
                                                   parallel::World& world, train::Trainer& trainer,
                                                   bool leader) {
    const std::string& resume = cfg.checkpoint.resume;
    if (resume == "never" || (resume == "auto" && !cfg.checkpoint.dir)) return std::nullopt;
    std::vector<std::string> candidates;
    if (resume == "auto") {
        candidates = train::list_checkpoints(*cfg.checkpoint.dir);
        std::reverse(candidates.begin(), candidates.end());
    } else {
        candidates.push_back(resume);
    }
    for (const std::string& dir : candidates) {
        std::optional<train::CheckpointShare> share;
        std::string error;
        try {
            share = train::read_share(dir, trainer.model().trainable_layout(),
                                      trainer.data_parallel().owned_ranges());
        } catch (const std::exception& e) {
            error = e.what();
        }
        error = parallel::first_failure(world.comm(), error);
        if (error.empty()) return share;
        if (resume != "auto") throw EveryRankError("checkpoint.resume: " + error);
        if (leader) {
            std::fprintf(stderr, "checkpoint: %s is unusable, trying the one before it: %s\n",
                         dir.c_str(), error.c_str());
        }
    }
    if (candidates.empty()) return std::nullopt;
    throw EveryRankError("checkpoint.dir: none of the " + std::to_string(candidates.size()) +
                         " checkpoints in '" + *cfg.checkpoint.dir +
                         "' is usable (see above); move them away to start afresh, or name "
                         "one with checkpoint.resume: PATH");
}

const char* signal_name(int signal) {
    return signal == SIGTERM ? "SIGTERM" : signal == SIGUSR1 ? "SIGUSR1" : "a signal";
}

// A sample of text from the trained model, as the config asks, on rank 0 with a whole copy
// of it with micro batch 1 (generation needs one sequence, not the training batch).
void print_sample(const config::Config& cfg, train::Trainer& trained, kernels::Ops& ops,
                  bool leader) {
    const std::vector<float> full = trained.full_params();  // collective
    if (!leader) return;
    train::GenerationModel whole(ops, trained.model().shape());
    whole.gpt().load_full_params(full);
    const auto tokenizer = data::tokenizer_for_vocab(cfg.model.vocab_size);
    train::SamplingOptions opts;
    opts.tokens = cfg.logging.sample_tokens;
    opts.seed = cfg.training.seed;
    std::string text;
    generate_text(whole.gpt(), *tokenizer, cfg.logging.sample_prompt, opts,
                  [&](const std::string& piece) { text += piece; });
    std::printf("sample (temperature %.1f, top-k %d):\n%s\n", opts.temperature, opts.top_k,
                text.c_str());
}

bool due(int step, int interval, int steps) {
    return step == steps || (interval > 0 && step % interval == 0);
}

// "step_000004 is the newest checkpoint" or "no checkpoint has been written".
std::string newest_checkpoint(const config::Config& cfg) {
    const auto all = train::list_checkpoints(*cfg.checkpoint.dir);
    return all.empty() ? "no checkpoint has been written to " + *cfg.checkpoint.dir
                       : all.back() + " is the newest checkpoint, as it was";
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
        throw EveryRankError(std::string(e.what()) + newest_or_none(cfg));
    }
}

// Everything a run needs that involves no communication beyond the grid's own set-up.
struct Setup {
    config::Config cfg;
    std::unique_ptr<parallel::Grid> grid;
    std::unique_ptr<data::Dataset> train_data, valid_data;
    Device device;
    // The data files as this node sees them, on one rank per node (the others: none), which is
    // enough to notice a change and reads a node's files once.
    std::vector<train::DataFileRecord> data_files;
    // Rank 0's hold on checkpoint.dir for the run's life (none without one, and elsewhere).
    std::unique_ptr<train::DirectoryLock> dir_lock;
};

std::vector<train::DataFileRecord> fingerprint_data(const data::Dataset* train_data,
                                                    const data::Dataset* valid_data) {
    std::vector<train::DataFileRecord> records;
    for (const data::Dataset* d : {train_data, valid_data}) {
        if (!d) continue;
        for (const data::Dataset::File& f : d->files()) {
            const io::Fingerprint print = io::fingerprint_file(f.path);
            records.push_back({f.key, f.path, print.bytes, print.sampled_sha256});
        }
    }
    return records;
}

// The data a checkpoint recorded against what the run reads now, on every rank that
// fingerprinted it: a change stops the resume, or with checkpoint.allow_data_change is said
// and let be. Collective.
void check_data(const Setup& setup, const train::CheckpointShare& ck, parallel::World& world,
                bool leader) {
    std::string change;
    if (ck.manifest.data_recorded && world.local_rank() == 0)
        change = train::describe_data_changes(ck.manifest.data, setup.data_files);
    change = parallel::first_failure(world.comm(), change);
    if (change.empty()) return;
    const std::string text = "the data changed since " + ck.path + " was written: " + change;
    if (!setup.cfg.checkpoint.allow_data_change)
        throw EveryRankError("checkpoint.resume: " + text +
                             "; resuming would not continue the run on the samples it planned. "
                             "Restore the files, or set checkpoint.allow_data_change: true if "
                             "the change is intended");
    if (leader) {
        std::fprintf(stderr,
                     "trident: warning: %s; going on (checkpoint.allow_data_change: true)\n",
                     text.c_str());
        std::fflush(stderr);
    }
}

// What a run of low-rank adapters records in its checkpoints (rank 0: none): the adapters,
// and (rank 0 alone reads them) the identity of the base weights `base` that
// initialise_weights read.
train::LoraRecord lora_record(const config::Config& cfg, const std::string& base, bool leader) {
    train::LoraRecord record;
    const config::LoraConfig& lora = cfg.training.lora;
    if (!lora.enabled()) return record;
    record.rank = lora.rank;
    for (const config::LoraTarget t : lora.targets) record.targets.push_back(config::to_string(t));
    record.alpha = lora.alpha;
    if (!leader) return record;
    record.base = std::filesystem::absolute(base).lexically_normal().string();
    record.base_sha256 = train::base_weights_sha256(base);
    // A checkpoint the adapters' checkpoints need is kept from its own run's rotation.
    if (cfg.checkpoint.dir && std::filesystem::is_directory(base)) {
        try {
            train::pin_base(base, *cfg.checkpoint.dir);
        } catch (const Error& e) {
            std::fprintf(stderr,
                         "trident: warning: cannot pin %s as these adapters' base (%s): its "
                         "run's checkpoint.keep may remove it\n",
                         base.c_str(), e.what());
        }
    }
    return record;
}

// A resume of adapters over other base weights than those they were trained on would train
// them on for another model: refused. Collective.
void check_base(const train::CheckpointShare& ck, const train::LoraRecord& now,
                parallel::World& world, bool leader) {
    std::string error;
    if (leader && ck.manifest.lora.base_sha256 != now.base_sha256)
        error = "checkpoint.resume: " + ck.path + " trained adapters over " +
                train::resolve_base(ck.manifest.lora.base, ck.path) + " (SHA-256 " +
                ck.manifest.lora.base_sha256.substr(0, 12) +
                "...), but model.init_from now reads " + now.base + " (SHA-256 " +
                now.base_sha256.substr(0, 12) +
                "...): restore those weights, or point model.init_from at them";
    error = parallel::first_failure(world.comm(), error);
    if (!error.empty()) throw EveryRankError(error);
}

void run(const Setup& setup, parallel::Grid& grid, parallel::World& world) {
    const config::Config& cfg = setup.cfg;
    const auto& t = cfg.training;
    const bool leader = grid.rank() == 0;
    const auto watchdog = start_watchdog(cfg, grid);

    auto ops = make_backend(cfg, setup.device, grid, leader);
    const Peak peak = peak_flops(cfg, setup.device, *ops, world.comm());
    if (leader) {
        print_warnings(cfg);
        print_summary(cfg, *ops, peak);
        std::printf("data: %s\n", setup.train_data->summary().c_str());
        if (setup.valid_data)
            std::printf("valid: %s | %s per validation\n", setup.valid_data->summary().c_str(),
                        train::counted(t.eval_sequences, "sequence").c_str());
        print_outputs(cfg);
    }

    train::Trainer trainer(cfg, *ops, grid);
    const std::string base = initialise_weights(cfg, trainer.model());
    if (leader && cfg.model.init_from) std::printf("weights: %s\n", base.c_str());
    const train::LoraRecord lora = lora_record(cfg, base, leader);
    if (leader && lora.rank > 0) {
        std::string targets;
        for (const std::string& t : lora.targets) targets += (targets.empty() ? "" : ", ") + t;
        const double trained = static_cast<double>(
            model::ParamLayout::for_lora(trainer.model().shape(), trainer.model().lora().shape)
                .total());
        std::printf(
            "lora: rank %d, alpha %g on %s: %s parameters train (%.2f%% of the model's), "
            "the model is frozen\n",
            lora.rank, lora.alpha, targets.c_str(), train::human_count(trained).c_str(),
            100.0 * trained / static_cast<double>(cfg.derived.parameters));
    }
    int start = 0, skipped_so_far = 0;
    std::optional<parallel::ScopedPhase> resuming(parallel::Phase::checkpoint);
    if (const auto ck = resume_point(cfg, world, trainer, leader)) {
        check_data(setup, *ck, world, leader);
        check_resume_changes(setup.cfg, *ck, world, leader);
        check_base(*ck, lora, world, leader);
        train::restore_checkpoint(*ck, trainer);  // collective
        start = ck->manifest.step;
        skipped_so_far = ck->manifest.skipped_total;
        const auto& l = ck->manifest.layout;
        // What the ranks read: the most any one read, against the whole checkpoint.
        int64_t read[2] = {static_cast<int64_t>(ck->tensor_bytes),
                           static_cast<int64_t>(ck->header_bytes)};
        world.comm().all_reduce(read, 2, parallel::ReduceOp::max);
        uint64_t total = 0;
        for (const train::ManifestFile& f : ck->manifest.files) total += f.bytes;
        if (leader) {
            std::printf("resumed: %s at step %d (written by %s, %s, ZeRO stage %d, %s)\n",
                        ck->path.c_str(), start,
                        config::layout_text(l.pipeline, l.tensor, l.context, l.data).c_str(),
                        l.schedule.c_str(), l.zero_stage, ck->manifest.precision.c_str());
            std::printf(
                "checkpoint read: at most %lld bytes of tensors and %lld of headers on "
                "a rank, of the checkpoint's %llu\n",
                static_cast<long long>(read[0]), static_cast<long long>(read[1]),
                static_cast<unsigned long long>(total));
        }
    }
    resuming.reset();
    parallel::set_step(start);
    if (start >= t.steps) {
        if (leader)
            std::printf("done: the checkpoint is at step %d, training.steps is %d\n", start,
                        t.steps);
        return;
    }
    train::install_preemption_handlers();
    if (leader) {
        const train::MemoryUse mem = trainer.memory();
        std::printf(
            "memory (rank 0): parameters %s | gradients %s | optimizer state %s "
            "(ZeRO stage %d over %s)\n",
            train::human_bytes(static_cast<double>(mem.parameters)).c_str(),
            train::human_bytes(static_cast<double>(mem.gradients)).c_str(),
            train::human_bytes(static_cast<double>(mem.optimizer)).c_str(), cfg.parallel.zero_stage,
            train::counted(cfg.parallel.data * cfg.parallel.context, "replica").c_str());
    }
    // The metrics file, opened by rank 0 alone: every rank learns whether it could be.
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

    const train::SampleFn train_sample = [&](uint64_t k, std::span<int32_t> in,
                                             std::span<int32_t> tgt) {
        setup.train_data->fill(k, in, tgt);
    };
    const train::SampleFn valid_sample = [&](uint64_t k, std::span<int32_t> in,
                                             std::span<int32_t> tgt) {
        setup.valid_data->fill(k, in, tgt);
    };

    std::optional<train::StragglerReport> stragglers;
    if (t.straggler_factor > 0) stragglers.emplace(t.straggler_factor, grid.shape(), world.comm());

    train::AsyncCheckpoint async;  // gone before the trainer whose share it may be writing
    double first_val = 0, last_val = 0;
    if (setup.valid_data) {
        first_val = last_val = trainer.evaluate(valid_sample, t.eval_sequences);
        if (leader)
            std::printf("step %5d/%d | val_loss %.4f (%s)\n", start, t.steps, first_val,
                        start > 0 ? "at resume" : "before training");
        // As step 0 of the metrics file (a resumed run's goes on from its checkpoint's step).
        std::string failure;
        if (log && start == 0)
            record_metrics([&] { log->record_validation(0, first_val); },
                           "the validation before training", cfg, failure);
        if (const std::string e = parallel::first_failure(world.comm(), failure); !e.empty())
            throw EveryRankError(e);
    }
    const auto& lg = cfg.logging;
    double seconds_so_far = 0;
    for (int s = start; s < t.steps; ++s) {
        {
            parallel::set_step(s + 1);
            const parallel::ScopedPhase phase(parallel::Phase::training);
            io::fault::at_step(s + 1, world.rank());
        }
        trainer.trace().set_recording(lg.trace && s + 1 >= lg.trace_from &&
                                      s + 1 < lg.trace_from + lg.trace_steps);
        const train::StepResult r = step_or_stop(cfg, trainer, s, train_sample);
        trainer.trace().set_recording(false);
        if (leader && !r.skip_note.empty()) {
            std::fprintf(stderr, "trident: warning: %s\n", r.skip_note.c_str());
            std::fflush(stderr);
        }
        train::StepMetrics m;
        m.step = s + 1;
        m.steps = t.steps;
        m.loss = r.loss;
        m.lr = r.lr;
        m.grad_norm = r.grad_norm;
        m.loss_scale = r.loss_scale;
        m.skipped = r.skipped;
        m.skip_reason = r.skip_reason;
        skipped_so_far += r.skipped;
        m.skipped_total = skipped_so_far;
        seconds_so_far += r.seconds;
        m.eta_s = seconds_so_far / (m.step - start) * (t.steps - m.step);  // at the mean so far
        m.tensor_comm = r.tensor_comm;
        m.activation_sets = static_cast<int64_t>(r.activation_sets);
        m.data_comm = r.data_comm;
        m.context_comm = r.context_comm;
        m.mem_params = static_cast<int64_t>(r.memory.parameters);
        m.mem_grads = static_cast<int64_t>(r.memory.gradients);
        m.mem_optimizer = static_cast<int64_t>(r.memory.optimizer);
        m.mem_activations = static_cast<int64_t>(r.memory.activations);
        m.mem_peak = static_cast<int64_t>(r.memory.peak);
        m.mem_stages = memory_of_stages(r.memory, grid, world);  // collective
        m.step_ms = 1e3 * r.seconds;
        m.tokens_per_s = static_cast<double>(cfg.derived.tokens_per_step) / r.seconds;
        // FLOP/s per process, as the papers count per GPU.
        const double flops = cfg.derived.flops_per_step / r.seconds / cfg.derived.world_size;
        m.tflops = flops / 1e12;
        m.mfu = flops / peak.flops;
        if (setup.valid_data && due(m.step, t.eval_interval, t.steps)) {
            m.val_loss = trainer.evaluate(valid_sample, t.eval_sequences);
            last_val = *m.val_loss;
        }
        std::string metrics_failure;
        if (log)
            record_metrics([&] { log->record(m); }, "step " + std::to_string(m.step), cfg,
                           metrics_failure);
        if (stragglers && s == start) stragglers->begin_after(m.step);
        if (stragglers && m.step % lg.interval == 0 && s > start)
            for (const std::string& line : stragglers->report(m.step))
                if (leader) std::printf("%s\n", line.c_str());
        if (t.check_replicas > 0 && m.step % t.check_replicas == 0)
            if (const std::string differ =
                    train::check_replicas(cfg, trainer, grid, world.comm(), m.step);
                !differ.empty())
                throw EveryRankError(differ + "; training stopped" + newest_or_none(cfg));
        std::string saved;  // this step's checkpoint, saved or begun
        if (cfg.checkpoint.dir && due(m.step, cfg.checkpoint.interval, t.steps))
            saved = save_or_report(cfg, trainer, grid, world, async, m.step, skipped_so_far,
                                   setup.data_files, lora, m.step == t.steps, leader);
        // A signal on any rank, or a failed write of rank 0's metrics, stops every rank here,
        // after the same step; an asynchronous save every rank has written is committed.
        int32_t stop[3] = {train::preemption_signal(), metrics_failure.empty() ? 0 : 1,
                           async.writing() ? 1 : 0};
        world.comm().all_reduce(stop, 3, parallel::ReduceOp::max);
        if (stop[1] != 0)
            throw EveryRankError(leader ? metrics_failure + "; " +
                                              (cfg.checkpoint.dir ? newest_checkpoint(cfg)
                                                                  : "checkpoint.dir is not set")
                                        : "the metrics file could not be written");
        if (stop[2] == 0 && async.pending())
            commit_pending(cfg, async, world, m.step, false, leader);
        const int32_t signal = stop[0];
        if (signal != 0) {
            if (cfg.checkpoint.dir && saved.empty())
                saved = save_or_report(cfg, trainer, grid, world, async, m.step, skipped_so_far,
                                       setup.data_files, lora, true, leader);
            else if (async.pending())
                saved = commit_pending(cfg, async, world, m.step, true, leader);
            if (leader) {
                std::printf("trident: preempted by %s (%d) after step %d of %d; %s\n",
                            signal_name(signal), signal, m.step, t.steps,
                            saved.empty() ? "no checkpoint written (checkpoint.dir is not set)"
                                          : ("checkpoint written to " + saved).c_str());
            }
            return;
        }
    }
    if (lg.trace) {
        // Written by rank 0 from what every rank gathered to it; every rank learns how it went.
        std::string error;
        try {
            trainer.write_trace(*lg.trace);  // collective
        } catch (const Error& e) {
            error = std::string("logging.trace: ") + e.what();
        }
        error = parallel::first_failure(world.comm(), error);
        if (!error.empty() && cfg.logging.on_error == config::OnError::stop)
            throw EveryRankError(error + " (logging.on_error: stop; training itself is done" +
                                 (cfg.checkpoint.dir ? ", " + newest_checkpoint(cfg) : "") + ")");
        if (leader && !error.empty())
            std::fprintf(stderr, "trident: warning: %s; no trace (logging.on_error: continue)\n",
                         error.c_str());
        else if (leader)
            std::printf("trace: %s\n", lg.trace->c_str());
    }
    if (cfg.logging.sample_tokens > 0) print_sample(cfg, trainer, *ops, leader);
    if (!leader) return;
    if (setup.valid_data)
        std::printf("done: %s | validation loss %.4f (%.4f before training)\n",
                    train::counted(t.steps, "step").c_str(), last_val, first_val);
    else
        std::printf("done: %s\n", train::counted(t.steps, "step").c_str());
}

}  // namespace

int train(const TrainOptions& opts, parallel::World& world) {
    // Every rank reads the same config and data; a problem any rank sees stops all of them.
    Setup setup;
    return run_on_every_rank(
        world,
        [&] {
            io::fault::check_settings();
            setup.cfg = config::load(opts.config, opts.overrides);
            const auto& p = setup.cfg.parallel;
            setup.grid = std::make_unique<parallel::Grid>(
                world, parallel::GridShape{p.pipeline, p.tensor, p.data, p.context});
            setup.device = choose_device(setup.cfg, world, world.rank() == 0);
            if (!setup.device.gpu) check_fits_memory(setup.cfg, world.local_size());
            setup.train_data = std::make_unique<data::Dataset>(data::open_train_data(setup.cfg));
            setup.valid_data = data::open_valid_data(setup.cfg);
            if (world.local_rank() == 0)
                setup.data_files = fingerprint_data(setup.train_data.get(), setup.valid_data.get());
            check_resume_setting(setup.cfg);
            if (const auto& dir = setup.cfg.checkpoint.dir; dir && world.rank() == 0)
                setup.dir_lock = train::claim_checkpoint_dir(*dir);  // before step 1
        },
        [&] { run(setup, *setup.grid, world); });
}

}  // namespace trident::commands
