// `trident generate`: prints a continuation of a prompt from trained weights (a Hugging Face
// GPT-2 safetensors file or a checkpoint, with low-rank adapters merged in if given).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include "commands/commands.h"
#include "commands/session.h"
#include "config/model_shape.h"
#include "data/tokenizer.h"
#include "kernels/error.h"
#include "kernels/ops.h"
#include "model/gpt.h"
#include "model/hf_config.h"
#include "model/hf_gpt2.h"
#include "model/lora.h"
#include "train/checkpoint.h"
#include "train/metrics.h"

namespace trident::commands {

namespace {

// --head-dim, else n_embd / n_head of the config.json beside --weights, else GPT-2's 64.
int head_dim_of(const GenerateOptions& opts) {
    const std::string config = model::hf_config_path(opts.weights);
    if (!std::filesystem::exists(config)) return opts.head_dim > 0 ? opts.head_dim : 64;
    const model::HfWidths widths = model::read_hf_gpt2_widths(config);
    if (widths.hidden % widths.heads != 0)
        throw Error(config + ": n_embd " + std::to_string(widths.hidden) +
                    " is not a multiple of n_head " + std::to_string(widths.heads));
    const int head_dim = widths.hidden / widths.heads;
    if (opts.head_dim > 0 && opts.head_dim != head_dim)
        throw Error("--head-dim " + std::to_string(opts.head_dim) + " disagrees with " + config +
                    " (n_embd / n_head = " + std::to_string(head_dim) + "); leave it out");
    return head_dim;
}

// Merges the adapters file `path` (trident export --lora-only) into `params`, the whole model
// of `shape`.
void merge_lora_file(const std::string& path, const model::GptShape& shape,
                     std::vector<float>& params) {
    const model::LoraFileInfo info = model::read_lora_info(path);
    const auto whole = model::ParamLayout::for_lora(shape, info.lora);
    std::vector<float> adapters(whole.total(), 0.0f);
    model::load_lora_file(path, whole, adapters.data());
    model::merge_lora(model::ParamLayout(shape), params.data(), whole, adapters.data(),
                      static_cast<float>(info.alpha / info.lora.rank));
}

}  // namespace

int generate(const GenerateOptions& opts) {
    if (opts.weights.empty() == opts.checkpoint.empty())
        throw Error("give exactly one of --weights F.safetensors and --checkpoint DIR");
    const train::SamplingOptions& s = opts.sampling;
    // A count beyond this would run for hours on the CPU even with the key/value cache; a typo
    // of extra digits is refused rather than started.
    constexpr int kMaxTokens = 100000;
    if (s.tokens < 1 || s.tokens > kMaxTokens)
        throw Error("--tokens must be in [1, " + std::to_string(kMaxTokens) + "], got " +
                    std::to_string(s.tokens));
    if (s.top_k < 0) throw Error("--top-k must not be negative");
    if (!(s.temperature >= 0) || !std::isfinite(s.temperature)) {
        char given[32];
        std::snprintf(given, sizeof given, "%g", s.temperature);
        throw Error(std::string("--temperature must be 0 (greedy: the likeliest token) or a "
                                "positive number, got ") +
                    given);
    }
    auto ops = kernels::make_cpu_ops(opts.threads);

    model::GptShape shape;
    std::vector<float> params;
    if (!opts.checkpoint.empty()) {
        train::LoadedModel loaded = train::load_model_checkpoint(opts.checkpoint);
        if (!opts.lora.empty() && !loaded.adapters.empty())
            throw Error(loaded.path +
                        " trained low-rank adapters of its own (merged in already): --lora "
                        "takes a checkpoint of a whole model");
        shape = config::gpt_shape(loaded.cfg);
        params = std::move(loaded.params);
    } else {
        shape = model::infer_hf_gpt2_shape(opts.weights, head_dim_of(opts));
        params.assign(model::ParamLayout(shape).total(), 0.0f);
        model::load_hf_gpt2(opts.weights, model::ParamLayout(shape), params.data());
    }
    if (!opts.lora.empty()) merge_lora_file(opts.lora, shape, params);
    train::GenerationModel whole(*ops, shape, params);
    const auto tokenizer = data::tokenizer_for_vocab(shape.vocab);
    const train::SamplingOptions& o = opts.sampling;
    const std::string tokens = train::counted(o.tokens, "token");
    if (o.temperature == 0)
        std::fprintf(stderr, "generate: %s, greedy (temperature 0)\n", tokens.c_str());
    else
        std::fprintf(stderr, "generate: %s, temperature %g, top-k %d%s, seed %llu\n",
                     tokens.c_str(), o.temperature, o.top_k, o.top_k == 0 ? " (all)" : "",
                     static_cast<unsigned long long>(o.seed));
    // Each piece as it comes: a long generation shows its progress.
    generate_text(whole.decoder(), *tokenizer, opts.prompt, opts.sampling,
                  [](const std::string& piece) {
                      std::fwrite(piece.data(), 1, piece.size(), stdout);
                      std::fflush(stdout);
                  });
    std::printf("\n");
    return 0;
}

}  // namespace trident::commands
