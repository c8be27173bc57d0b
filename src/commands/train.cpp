// `trident train`: trains the configured model on its dataset, with validation, metrics,
// checkpoints, resuming and preemption, on every rank of the grid (rank 0 speaks for all).
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include "commands/commands.h"
#include "commands/resume_changes.h"
#include "commands/session.h"
#include "commands/start_checks.h"
#include "commands/train_loop.h"
#include "data/dataset.h"
#include "data_parallel/param_file.h"
#include "io/fault_injection.h"
#include "io/fingerprint.h"
#include "io/user_paths.h"
#include "kernels/error.h"
#include "model/param_layout.h"
#include "optim/offload_store.h"
#include "optim/owned_ranges.h"
#include "optim/update.h"
#include "parallel/agreement.h"
#include "parallel/grid.h"
#include "parallel/world.h"
#include "train/base_weights.h"
#include "train/checkpoint.h"
#include "train/directory_lock.h"
#include "train/metrics.h"
#include "train/preemption.h"
#include "train/trainer.h"

namespace trident::commands {

namespace {

// The paths a run reads beyond its data, their status readable (io/user_paths.h): a loop of
// symbolic links or an unreadable directory is named by its key, not by the file system.
void check_input_paths(const config::Config& cfg) {
    if (cfg.model.init_from) io::check_input_path(*cfg.model.init_from, "model.init_from");
    if (const auto& lora = cfg.training.lora.init_from)
        io::check_input_path(*lora, "training.lora.init_from");
    if (cfg.checkpoint.resume != "never" && cfg.checkpoint.resume != "auto")
        io::check_input_path(cfg.checkpoint.resume, "checkpoint.resume");
}

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
    std::error_code error;
    if (ck.resume != "never" && ck.resume != "auto" &&
        !std::filesystem::exists(std::filesystem::path(ck.resume) / train::kManifestName, error))
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
            share = train::read_share(dir, trainer.model().trainable().layout(),
                                      trainer.data_parallel().owned_ranges(), true,
                                      trainer.optimizer().matrix_states());
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

// A sample of text from the trained model, as the config asks, on rank 0 with a whole copy
// of it with micro batch 1 (generation needs one sequence, not the training batch).
void print_sample(const Setup& setup, train::Trainer& trained, kernels::Ops& ops, bool leader) {
    const config::Config& cfg = setup.cfg;
    const std::vector<float> full = trained.full_params();  // collective
    if (!leader) return;
    train::GenerationModel whole(ops, trained.model().layout().shape(), full);
    const data::Tokenizer& tokenizer = *setup.sample_tokenizer;  // loaded at start-up
    train::SamplingOptions opts;
    opts.tokens = cfg.logging.sample_tokens;
    opts.seed = cfg.training.seed;
    opts.eod = train::generation_eod(cfg.data);
    std::string text;
    generate_text(whole.decoder(), tokenizer, cfg.logging.sample_prompt, opts,
                  [&](const std::string& piece) { text += piece; });
    std::printf("sample (temperature %.1f, top-k %d):\n%s\n", opts.temperature, opts.top_k,
                text.c_str());
}

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

// Says what the adapters train against the frozen model.
void print_lora(const config::Config& cfg, train::Trainer& trainer, const train::LoraRecord& lora) {
    std::string targets;
    for (const std::string& t : lora.targets) targets += (targets.empty() ? "" : ", ") + t;
    const double trained = static_cast<double>(trainer.model().adapters().whole().total());
    std::printf(
        "lora: rank %d, alpha %g on %s: %s parameters train (%.2f%% of the model's), "
        "the model is frozen\n",
        lora.rank, lora.alpha, targets.c_str(), train::human_count(trained).c_str(),
        100.0 * trained / static_cast<double>(cfg.derived.parameters));
}

// Restores the newest checkpoint, if any, after checking that it fits this run (collective),
// and says what was read.
Start resume(const Setup& setup, parallel::World& world, train::Trainer& trainer,
             const train::LoraRecord& lora, bool leader) {
    const config::Config& cfg = setup.cfg;
    const parallel::ScopedPhase resuming(parallel::Phase::checkpoint);
    const auto ck = resume_point(cfg, world, trainer, leader);
    if (!ck) return {};
    check_data(setup, *ck, world, leader);
    check_resume_changes(cfg, *ck, world, leader);
    check_base(*ck, lora, world, leader);
    try {
        train::restore_checkpoint(*ck, trainer);  // collective
    } catch (const train::TrainingStopped& e) {
        throw EveryRankError("checkpoint.resume: " + ck->path + ": " + e.what());
    }
    const auto& l = ck->manifest.layout;
    // What the ranks read: the most any one read, against the whole checkpoint.
    int64_t read[2] = {static_cast<int64_t>(ck->tensor_bytes),
                       static_cast<int64_t>(ck->header_bytes)};
    world.comm().all_reduce(read, 2, parallel::ReduceOp::max);
    uint64_t total = 0;
    for (const train::ManifestFile& f : ck->manifest.files) total += f.bytes;
    if (leader) {
        std::printf("resumed: %s at step %d (written by %s, %s, ZeRO stage %d, %s)\n",
                    ck->path.c_str(), ck->manifest.step,
                    config::layout_text(l.pipeline, l.tensor, l.context, l.data).c_str(),
                    l.schedule.c_str(), l.zero_stage, ck->manifest.precision.c_str());
        std::printf(
            "checkpoint read: at most %lld bytes of tensors and %lld of headers on a rank, of "
            "the checkpoint's %llu\n",
            static_cast<long long>(read[0]), static_cast<long long>(read[1]),
            static_cast<unsigned long long>(total));
    }
    return {ck->manifest.step, ck->manifest.skipped_total};
}

// What optimizer.offload asks, where it can be found before training starts: the directory
// of nvme's files.
void check_offload_setting(const config::Config& cfg) {
    if (cfg.optimizer.offload == config::Offload::nvme)
        optim::check_offload_dir(*cfg.optimizer.offload_dir, 0);
}

// Where the optimizer state (and ZeRO-3's parameter shard) lives, when not in device memory:
// rank 0's per-element state off the device (every array for every owned parameter,
// optim/update.h), and a matrix optimizer's per-matrix state kept on the device.
void print_offload(const config::Config& cfg, train::Trainer& trainer, kernels::Ops& ops) {
    const config::OptimizerConfig& o = cfg.optimizer;
    if (o.offload == config::Offload::none) return;
    const std::size_t per_parameter = optim::state_bytes(cfg.training, o).most();
    std::printf(
        "offload: rank 0's optimizer state off the device: %s (%zu bytes for each of its "
        "%zu owned parameters)\n",
        train::human_bytes(
            static_cast<double>(per_parameter * trainer.data_parallel().owned_count()))
            .c_str(),
        per_parameter, trainer.data_parallel().owned_count());
    std::size_t per_matrix = 0;
    for (const auto& [name, elements] : trainer.optimizer().matrix_states())
        per_matrix += elements * sizeof(float);
    if (per_matrix > 0)
        std::printf("offload: rank 0's per-matrix state (%s) stays on the device: %s\n",
                    config::to_string(o.name),
                    train::human_bytes(static_cast<double>(per_matrix)).c_str());
    if (o.offload == config::Offload::host)
        std::printf(
            "offload: optimizer state in %s host memory, its element step on the host in chunks "
            "of %d parameters\n",
            std::string(ops.name()) == "cpu" ? "the cpu backend's own" : "page-locked",
            o.offload_chunk);
    if (const optim::OffloadStore* store = trainer.optimizer().store())
        std::printf(
            "offload: optimizer state in %s (rank 0's; one file per rank), streamed in "
            "chunks of %zu parameters through %s of host buffers\n",
            store->path().c_str(), store->chunk(),
            train::human_bytes(static_cast<double>(store->buffer_bytes())).c_str());
    if (const data_parallel::ParamFile* file = trainer.data_parallel().param_file())
        std::printf(
            "offload: ZeRO-3's parameter shard in %s (rank 0's), each unit's part read ahead "
            "of its gather\n",
            file->path().c_str());
}

// A matrix optimizer's groups, over the whole model: what it steps and what AdamW does.
void print_optimizer_split(const config::Config& cfg, train::Trainer& trainer) {
    if (cfg.optimizer.name == config::OptimizerName::adamw) return;
    const model::ParamLayout whole(trainer.model().trainable().layout().shape());
    const optim::MatrixSplit s = optim::matrix_split(whole);
    const optim::StateBytes bytes = optim::state_bytes(cfg.training, cfg.optimizer);
    // Per element, and per whole matrix (GaLore's, on the matrices' owners).
    const std::size_t matrix_state =
        bytes.matrix * s.matrix_parameters +
        optim::matrix_state_bytes(trainer.optimizer().optimizer(), whole);
    std::printf(
        "optimizer: %s on %s (%s parameters, %s of state) | adamw on %s (%s parameters, %s "
        "of state)\n",
        config::to_string(cfg.optimizer.name),
        train::counted(static_cast<int64_t>(s.matrices), "layer weight").c_str(),
        train::human_count(static_cast<double>(s.matrix_parameters)).c_str(),
        train::human_bytes(static_cast<double>(matrix_state)).c_str(),
        train::counted(static_cast<int64_t>(s.others), "other tensor").c_str(),
        train::human_count(static_cast<double>(s.other_parameters)).c_str(),
        train::human_bytes(static_cast<double>(bytes.other * s.other_parameters)).c_str());
}

void print_memory(const config::Config& cfg, train::Trainer& trainer) {
    const train::MemoryUse mem = trainer.memory();
    std::printf(
        "memory (rank 0): parameters %s | gradients %s | optimizer state %s (ZeRO stage %d "
        "over %s)\n",
        train::human_bytes(static_cast<double>(mem.parameters)).c_str(),
        train::human_bytes(static_cast<double>(mem.gradients)).c_str(),
        train::human_bytes(static_cast<double>(mem.optimizer)).c_str(), cfg.parallel.zero_stage,
        train::counted(cfg.parallel.data * cfg.parallel.context, "replica").c_str());
    if (mem.quantized_parameters == 0) return;
    std::printf(
        "memory (rank 0): 4-bit base %zu bytes of codes and constants for %zu parameters "
        "(%.3f bits each) | dequantization tile %s\n",
        mem.quantized, mem.quantized_parameters,
        8.0 * static_cast<double>(mem.quantized) / static_cast<double>(mem.quantized_parameters),
        train::human_bytes(static_cast<double>(mem.tile)).c_str());
}

// Writes the trace (rank 0, from what every rank gathered to it); every rank learns how it
// went.
void write_trace(const config::Config& cfg, train::Trainer& trainer, parallel::World& world,
                 bool leader) {
    const std::string& path = *cfg.logging.trace;
    std::string error;
    try {
        trainer.write_trace(path);  // collective
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
        std::printf("trace: %s\n", path.c_str());
}

// The validation evaluates samples 0 .. eval_sequences - 1 of data.valid, which wrap round a
// set smaller than that: some are counted more than once, weighting the loss towards them.
void warn_repeated_validation(const config::Config& cfg, const data::Dataset& valid) {
    std::size_t samples = 0;
    for (std::size_t i = 0; i < valid.datasets(); ++i) samples += valid.sampler(i).windows();
    const auto wanted = static_cast<std::size_t>(cfg.training.eval_sequences);
    if (samples >= wanted) return;
    const std::size_t unit = static_cast<std::size_t>(cfg.training.micro_batch) * cfg.parallel.data;
    const std::size_t fits = samples / unit * unit;
    warn("training.eval_sequences is " + std::to_string(wanted) + " but data.valid holds " +
         train::counted(static_cast<int64_t>(samples), "sample") +
         ": each validation counts some of them more than once; " +
         (fits > 0 ? "set it to " + std::to_string(fits) +
                         " (a multiple of micro_batch x parallel.data) to count each once"
                   : std::string("a larger data.valid would count each once")));
}

// The trainer. A rank that cannot make its optimizer state's file, or its parameter shard's
// (its own disk without room for it, say), stops every rank with its message: nothing
// collective follows the files' creation in the trainer's construction (the shard's is made
// after the model, the state's after the data-parallel exchange; neither they nor what
// follows call the group).
std::unique_ptr<train::Trainer> make_trainer(const config::Config& cfg, kernels::Ops& ops,
                                             parallel::Grid& grid, parallel::World& world) {
    std::unique_ptr<train::Trainer> trainer;
    std::string error;
    try {
        trainer = std::make_unique<train::Trainer>(cfg, ops, grid);
    } catch (const optim::OffloadError& e) {
        error = e.what();
    }
    if (const std::string e = parallel::first_failure(world.comm(), error); !e.empty())
        throw EveryRankError(e);
    return trainer;
}

// Runs the training; returns the signal that stopped it (agreed by every rank), or 0.
int run(const Setup& setup, parallel::Grid& grid, parallel::World& world) {
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
        if (setup.valid_data) {
            std::printf("valid: %s | %s per validation\n", setup.valid_data->summary().c_str(),
                        train::counted(t.eval_sequences, "sequence").c_str());
            warn_repeated_validation(cfg, *setup.valid_data);
        }
        print_outputs(cfg);
    }

    const std::unique_ptr<train::Trainer> made = make_trainer(cfg, *ops, grid, world);
    train::Trainer& trainer = *made;
    const std::string base = initialise_weights(cfg, trainer.model());
    if (leader && cfg.model.init_from) std::printf("weights: %s\n", base.c_str());
    const train::LoraRecord lora = lora_record(cfg, base, leader);
    if (leader && lora.rank > 0) print_lora(cfg, trainer, lora);
    const Start start = resume(setup, world, trainer, lora, leader);
    parallel::set_step(start.step);
    if (start.step >= t.steps) {
        if (leader)
            std::printf("done: the checkpoint is at step %d, training.steps is %d\n", start.step,
                        t.steps);
        return 0;
    }
    if (leader) print_memory(cfg, trainer);
    if (leader) print_optimizer_split(cfg, trainer);
    if (leader) print_offload(cfg, trainer, *ops);

    Loop loop(setup, grid, world, trainer, lora, peak, start);
    if (!loop.run()) return loop.stopped_by();
    if (cfg.logging.trace) write_trace(cfg, trainer, world, leader);
    if (cfg.logging.sample_tokens > 0) print_sample(setup, trainer, *ops, leader);
    if (!leader) return 0;
    // The first validation's: before training, or at the resume.
    const std::string since =
        start.step > 0 ? "at step " + std::to_string(start.step) : "before training";
    if (setup.valid_data)
        std::printf("done: %s | validation loss %.4f (%.4f %s)\n",
                    train::counted(t.steps, "step").c_str(), loop.last_val(), loop.first_val(),
                    since.c_str());
    else
        std::printf("done: %s\n", train::counted(t.steps, "step").c_str());
    return 0;
}

// What rank 0 alone writes or loads, checked and taken before step 1: its output files, the
// sample's tokenizer, the locks on checkpoint.dir and logging.metrics; and what it warns of.
void set_up_leader(Setup& setup) {
    const config::Config& cfg = setup.cfg;
    // The directory first: the metrics' default lies in it.
    if (cfg.checkpoint.dir) setup.dir_lock = train::claim_checkpoint_dir(*cfg.checkpoint.dir);
    check_logging_outputs(cfg);
    setup.sample_tokenizer = sample_tokenizer(cfg);
    for (const std::string& w :
         {epochs_per_step(cfg, *setup.train_data), missing_eod(cfg, *setup.train_data)})
        if (!w.empty()) setup.cfg.warnings.push_back(w);
    if (cfg.logging.metrics)
        setup.metrics_lock =
            std::make_unique<train::FileLock>(*cfg.logging.metrics, "logging.metrics");
}

}  // namespace

int train(const TrainOptions& opts, parallel::World& world) {
    // The signal handlers are in place since before MPI started (main.cpp); rank 0 alone
    // answers Ctrl-C on the terminal.
    train::set_interrupt_speaker(world.rank() == 0);
    // Every rank reads the same config and data; a problem any rank sees stops all of them.
    Setup setup;
    int signal = 0;
    const int code = run_on_every_rank(
        world,
        [&] {
            io::fault::check_settings();
            setup.cfg = config::load(opts.config, opts.overrides);
            train::set_interrupt_saves(setup.cfg.checkpoint.dir.has_value());
            setup.grid = std::make_unique<parallel::Grid>(world, grid_shape(setup.cfg));
            setup.device = choose_device(setup.cfg, world, world.rank() == 0);
            if (!setup.device.gpu) check_fits_memory(setup.cfg, world.local_size());
            setup.train_data = std::make_unique<data::Dataset>(data::open_train_data(setup.cfg));
            setup.valid_data = data::open_valid_data(setup.cfg);
            if (world.local_rank() == 0)
                setup.data_files = fingerprint_data(setup.train_data.get(), setup.valid_data.get());
            check_input_paths(setup.cfg);
            check_resume_setting(setup.cfg);
            check_offload_setting(setup.cfg);
            if (world.rank() == 0) set_up_leader(setup);
        },
        [&] { signal = run(setup, *setup.grid, world); });
    // Stopped by Ctrl-C, checkpointed or not: the shell's code for an interrupted command, so
    // that `trident train ... && next` does not go on.
    return code == 0 && signal == SIGINT ? 128 + SIGINT : code;
}

}  // namespace trident::commands
