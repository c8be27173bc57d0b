// `trident train`: trains the configured model on its dataset, with validation, metrics and
// a model checkpoint at the end.
#include <cstdio>
#include <memory>

#include "commands/commands.h"
#include "commands/session.h"
#include "data/dataset.h"
#include "error.h"
#include "train/device_peak.h"
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

// A sample of text from the trained model, as the config asks, on a copy of it with micro
// batch 1 (generation needs one sequence, not the training batch).
void print_sample(const config::Config& cfg, const model::Gpt& trained, kernels::Ops& ops) {
    model::Gpt gpt(ops, trained.shape(), 1, 0.0f);
    gpt.load_params(trained.params_to_host());
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

}  // namespace

int train(const TrainOptions& opts) {
    const config::Config cfg = config::load(opts.config, opts.overrides);
    const auto& t = cfg.training;

    // Everything that can be wrong with the input is checked before the first step.
    data::Dataset train_data = data::open_train_data(cfg);
    const std::unique_ptr<data::Dataset> valid_data = data::open_valid_data(cfg);
    refuse_existing_checkpoints(cfg);

    auto ops = make_backend(cfg);
    const double peak = train::measure_gemm_flops(*ops);
    print_summary(cfg, *ops, peak);
    std::printf("data: %s\n", train_data.summary().c_str());
    if (valid_data) std::printf("valid: %s\n", valid_data->summary().c_str());

    train::Trainer trainer(cfg, *ops);
    initialise_weights(cfg, trainer.model());
    train::MetricsLog log(cfg.logging.metrics, cfg.logging.interval);

    const train::SampleFn train_sample = [&](uint64_t k, std::span<int32_t> in,
                                             std::span<int32_t> tgt) {
        train_data.fill(k, in, tgt);
    };
    const train::SampleFn valid_sample = [&](uint64_t k, std::span<int32_t> in,
                                             std::span<int32_t> tgt) {
        valid_data->fill(k, in, tgt);
    };

    double first_val = 0, last_val = 0;
    if (valid_data) {
        first_val = last_val = trainer.evaluate(valid_sample, t.eval_batches);
        std::printf("step %5d/%d | val_loss %.4f (before training)\n", 0, t.steps, first_val);
    }
    for (int s = 0; s < t.steps; ++s) {
        const train::StepResult r = trainer.step(s, train_sample);
        train::StepMetrics m;
        m.step = s + 1;
        m.steps = t.steps;
        m.loss = r.loss;
        m.lr = r.lr;
        m.grad_norm = r.grad_norm;
        m.step_ms = 1e3 * r.seconds;
        m.tokens_per_s = static_cast<double>(cfg.derived.tokens_per_step) / r.seconds;
        m.tflops = cfg.derived.flops_per_step / r.seconds / 1e12;
        m.mfu = cfg.derived.flops_per_step / r.seconds / peak;
        if (valid_data && due(m.step, t.eval_interval, t.steps)) {
            m.val_loss = trainer.evaluate(valid_sample, t.eval_batches);
            last_val = *m.val_loss;
        }
        log.record(m);
        if (cfg.checkpoint.dir && due(m.step, cfg.checkpoint.interval, t.steps)) {
            const auto host = trainer.model().params_to_host();
            const std::string where =
                train::save_model_checkpoint(cfg, m.step, trainer.model().layout(), host.data());
            std::printf("checkpoint: %s\n", where.c_str());
        }
    }
    if (cfg.logging.sample_tokens > 0) print_sample(cfg, trainer.model(), *ops);
    if (valid_data)
        std::printf("done: %d steps | validation loss %.4f (%.4f before training)\n", t.steps,
                    last_val, first_val);
    else
        std::printf("done: %d steps\n", t.steps);
    return 0;
}

}  // namespace trident::commands
