// Shared start-up of `train` and `bench` (see session.h).
#include "commands/session.h"

#include <cstdio>

#include "model/hf_gpt2.h"
#include "train/metrics.h"

namespace trident::commands {

int run_on_every_rank(parallel::World& world, const std::function<void()>& set_up,
                      const std::function<void()>& run) {
    std::string error;
    try {
        set_up();
    } catch (const std::exception& e) {
        error = e.what();
    }
    if (parallel::any_rank_failed(world, !error.empty()))
        return parallel::report_failure(world, error, parallel::FailureKind::agreed);
    try {
        run();
    } catch (const EveryRankError& e) {
        return parallel::report_failure(world, e.what(), parallel::FailureKind::every_rank);
    } catch (const std::exception& e) {
        return parallel::report_failure(world, e.what(), parallel::FailureKind::this_rank);
    }
    return 0;
}

std::unique_ptr<kernels::Ops> make_backend(const config::Config& cfg, bool announce) {
    if (announce && cfg.device == config::DeviceKind::auto_)
        std::printf("device: cpu (auto: this build has no GPU backend)\n");
    return kernels::make_cpu_ops(cfg.training.threads);
}

void print_summary(const config::Config& cfg, const kernels::Ops& ops, double peak_flops) {
    const auto& m = cfg.model;
    const auto& t = cfg.training;
    const auto& d = cfg.derived;
    std::printf("model: %s parameters | layers %d | hidden %d | heads %d | ffn %d | seq %d | "
                "vocab %d (padded %d)\n",
                train::human_count(static_cast<double>(d.parameters)).c_str(), m.layers, m.hidden,
                m.heads, m.ffn_hidden, m.seq_len, m.vocab_size, d.padded_vocab);
    std::printf("layout: %d x %d x %d (pipeline x tensor x data) | backend %s | precision %s\n",
                cfg.parallel.pipeline, cfg.parallel.tensor, cfg.parallel.data, ops.name(),
                config::to_string(t.precision));
    std::printf("batch: %d sequences = %lld tokens per step | micro batch %d | %d accumulation "
                "steps | %s FLOP per step\n",
                t.global_batch, static_cast<long long>(d.tokens_per_step), t.micro_batch,
                d.grad_accum_steps, train::human_count(d.flops_per_step).c_str());
    std::printf("peak: %.1f GFLOP/s (fp32 GEMM measured at start-up; MFU is against this)\n",
                peak_flops / 1e9);
    std::fflush(stdout);
}

void initialise_weights(const config::Config& cfg, model::Gpt& model) {
    if (cfg.model.init_from) {
        // The whole model from the file; each tensor-parallel rank keeps its slice.
        const model::ParamLayout full_layout(model.shape());
        std::vector<float> full(full_layout.total(), 0.0f);
        model::load_hf_gpt2(*cfg.model.init_from, full_layout, full.data());
        model.load_full_params(full);
    } else {
        model.init_random(cfg.training.seed, static_cast<float>(cfg.model.init_std));
    }
}

std::string generate_text(model::Gpt& model, const data::Tokenizer& tokenizer,
                          const std::string& prompt, const train::SamplingOptions& opts) {
    std::vector<int32_t> ids;
    tokenizer.encode(prompt, ids);
    if (ids.empty()) tokenizer.encode("\n", ids);
    if (prompt.empty() && tokenizer.end_of_text()) ids.assign(1, *tokenizer.end_of_text());
    const std::vector<int32_t> continuation = train::generate(model, ids, opts);
    return prompt + tokenizer.decode(continuation);
}

}  // namespace trident::commands
