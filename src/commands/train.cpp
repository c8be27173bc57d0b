// `trident train`: trains the configured model on its dataset, with validation, metrics and
// a model checkpoint at the end, on every rank of the grid (rank 0 speaks for all).
#include <cstdio>
#include <memory>
#include <optional>

#include "commands/commands.h"
#include "commands/session.h"
#include "data/dataset.h"
#include "error.h"
#include "parallel/grid.h"
#include "parallel/world.h"
#include "train/metrics.h"
#include "train/model_checkpoint.h"
#include "train/trainer.h"

namespace trident::commands {

namespace {

// Resuming lands with checkpoints proper; until then a run never overwrites earlier ones.
void refuse_existing_checkpoints(const config::Config& cfg) {
    if (!cfg.checkpoint.dir) return;
    const auto existing = train::list_checkpoints(*cfg.checkpoint.dir);
    if (!existing.empty())
        throw Error("checkpoint.dir: '" + *cfg.checkpoint.dir + "' already holds checkpoints (" +
                    existing.back() + ") and resuming is not supported yet; choose another "
                    "checkpoint.dir (e.g. --set checkpoint.dir=runs/new) so they are kept");
}

// A sample of text from the trained model, as the config asks, on rank 0 with a whole copy
// of it with micro batch 1 (generation needs one sequence, not the training batch).
void print_sample(const config::Config& cfg, train::Trainer& trained, kernels::Ops& ops, bool leader) {
    const std::vector<float> full = trained.full_params();  // collective
    if (!leader) return;
    model::Gpt gpt(ops, trained.model().shape(), 1, 0.0f);
    gpt.load_full_params(full);
    const auto tokenizer = data::tokenizer_for_vocab(cfg.model.vocab_size);
    train::SamplingOptions opts;
    opts.tokens = cfg.logging.sample_tokens;
    opts.temperature = 0.8;
    opts.top_k = 40;
    opts.seed = cfg.training.seed;
    std::printf("sample (temperature %.1f, top-k %d):\n%s\n", opts.temperature, opts.top_k,
                generate_text(gpt, *tokenizer, cfg.logging.sample_prompt, opts).c_str());
}

bool due(int step, int interval, int steps) {
    return step == steps || (interval > 0 && step % interval == 0);
}


// Everything a run needs that involves no communication beyond the grid's own set-up.
struct Setup {
    config::Config cfg;
    std::unique_ptr<parallel::Grid> grid;
    std::unique_ptr<data::Dataset> train_data, valid_data;
    Device device;
};

void run(const Setup& setup, parallel::Grid& grid) {
    const config::Config& cfg = setup.cfg;
    const auto& t = cfg.training;
    const bool leader = grid.rank() == 0;

    auto ops = make_backend(cfg, setup.device, grid, leader);
    const Peak peak = peak_flops(setup.device, *ops);
    if (leader) {
        print_summary(cfg, *ops, peak);
        std::printf("data: %s\n", setup.train_data->summary().c_str());
        if (setup.valid_data) std::printf("valid: %s\n", setup.valid_data->summary().c_str());
    }

    train::Trainer trainer(cfg, *ops, &grid);
    initialise_weights(cfg, trainer.model());
    if (leader && cfg.model.init_from) std::printf("weights: %s\n", cfg.model.init_from->c_str());
    if (leader) {
        const train::MemoryUse mem = trainer.memory();
        std::printf("memory (rank 0): parameters %s | gradients %s | optimizer state %s "
                    "(ZeRO stage %d over %d replicas)\n",
                    train::human_bytes(static_cast<double>(mem.parameters)).c_str(),
                    train::human_bytes(static_cast<double>(mem.gradients)).c_str(),
                    train::human_bytes(static_cast<double>(mem.optimizer)).c_str(),
                    cfg.parallel.zero_stage, cfg.parallel.data);
    }
    std::optional<train::MetricsLog> log;
    if (leader) log.emplace(cfg.logging.metrics, cfg.logging.interval);

    const train::SampleFn train_sample = [&](uint64_t k, std::span<int32_t> in,
                                             std::span<int32_t> tgt) {
        setup.train_data->fill(k, in, tgt);
    };
    const train::SampleFn valid_sample = [&](uint64_t k, std::span<int32_t> in,
                                             std::span<int32_t> tgt) {
        setup.valid_data->fill(k, in, tgt);
    };

    double first_val = 0, last_val = 0;
    if (setup.valid_data) {
        first_val = last_val = trainer.evaluate(valid_sample, t.eval_batches);
        if (leader) std::printf("step %5d/%d | val_loss %.4f (before training)\n", 0, t.steps, first_val);
    }
    const auto& lg = cfg.logging;
    double seconds_so_far = 0;
    int skipped_so_far = 0;
    for (int s = 0; s < t.steps; ++s) {
        trainer.trace().set_recording(lg.trace && s + 1 >= lg.trace_from &&
                                      s + 1 < lg.trace_from + lg.trace_steps);
        const train::StepResult r = trainer.step(s, train_sample);
        trainer.trace().set_recording(false);
        train::StepMetrics m;
        m.step = s + 1;
        m.steps = t.steps;
        m.loss = r.loss;
        m.lr = r.lr;
        m.grad_norm = r.grad_norm;
        m.loss_scale = r.loss_scale;
        m.skipped = r.skipped;
        skipped_so_far += r.skipped;
        m.skipped_total = skipped_so_far;
        seconds_so_far += r.seconds;
        m.eta_s = seconds_so_far / m.step * (t.steps - m.step);  // at the mean step time so far
        m.tensor_comm = r.tensor_comm;
        m.activation_sets = static_cast<int64_t>(r.activation_sets);
        m.data_comm = r.data_comm;
        m.mem_params = static_cast<int64_t>(r.memory.parameters);
        m.mem_grads = static_cast<int64_t>(r.memory.gradients);
        m.mem_optimizer = static_cast<int64_t>(r.memory.optimizer);
        m.mem_activations = static_cast<int64_t>(r.memory.activations);
        m.mem_peak = static_cast<int64_t>(r.memory.peak);
        m.step_ms = 1e3 * r.seconds;
        m.tokens_per_s = static_cast<double>(cfg.derived.tokens_per_step) / r.seconds;
        // FLOP/s per process, as the papers count per GPU.
        const double flops = cfg.derived.flops_per_step / r.seconds / cfg.derived.world_size;
        m.tflops = flops / 1e12;
        m.mfu = flops / peak.flops;
        if (setup.valid_data && due(m.step, t.eval_interval, t.steps)) {
            m.val_loss = trainer.evaluate(valid_sample, t.eval_batches);
            last_val = *m.val_loss;
        }
        if (log) log->record(m);
        if (cfg.checkpoint.dir && due(m.step, cfg.checkpoint.interval, t.steps)) {
            const auto full = trainer.full_params();  // collective
            if (leader) {
                const model::ParamLayout full_layout(trainer.model().shape());
                const std::string where =
                    train::save_model_checkpoint(cfg, m.step, full_layout, full.data());
                std::printf("checkpoint: %s\n", where.c_str());
            }
        }
    }
    if (lg.trace) {
        trainer.write_trace(*lg.trace);  // collective
        if (leader) std::printf("trace: %s\n", lg.trace->c_str());
    }
    if (cfg.logging.sample_tokens > 0) print_sample(cfg, trainer, *ops, leader);
    if (!leader) return;
    if (setup.valid_data)
        std::printf("done: %d steps | validation loss %.4f (%.4f before training)\n", t.steps,
                    last_val, first_val);
    else
        std::printf("done: %d steps\n", t.steps);
}

}  // namespace

int train(const TrainOptions& opts, parallel::World& world) {
    // Every rank reads the same config and data; a problem any rank sees stops all of them.
    Setup setup;
    return run_on_every_rank(
        world,
        [&] {
            setup.cfg = config::load(opts.config, opts.overrides);
            const auto& p = setup.cfg.parallel;
            setup.grid = std::make_unique<parallel::Grid>(
                world, parallel::GridShape{p.pipeline, p.tensor, p.data});
            setup.device = choose_device(setup.cfg, world, world.rank() == 0);
            setup.train_data = std::make_unique<data::Dataset>(data::open_train_data(setup.cfg));
            setup.valid_data = data::open_valid_data(setup.cfg);
            refuse_existing_checkpoints(setup.cfg);
        },
        [&] { run(setup, *setup.grid); });
}

}  // namespace trident::commands
