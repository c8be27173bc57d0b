// `trident generate`: prints a continuation of a prompt from trained weights (a Hugging Face
// GPT-2 safetensors file, with low-rank adapters merged in if given, or a checkpoint).
#include <cmath>
#include <cstdio>
#include <string>

#include "commands/commands.h"
#include "commands/session.h"
#include "data/tokenizer.h"
#include "error.h"
#include "kernels/ops.h"
#include "model/gpt.h"
#include "model/hf_gpt2.h"
#include "model/lora.h"
#include "train/checkpoint.h"
#include "train/model_shape.h"

namespace trident::commands {

int generate(const GenerateOptions& opts) {
    if (opts.weights.empty() == opts.checkpoint.empty())
        throw Error("give exactly one of --weights F.safetensors and --checkpoint DIR");
    const train::SamplingOptions& s = opts.sampling;
    // No KV cache: each token reruns the model over the context, so a count beyond this would
    // run for days; a typo of extra digits is refused rather than started.
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
        shape = train::gpt_shape(loaded.cfg);
        params = std::move(loaded.params);
    } else {
        shape = model::infer_hf_gpt2_shape(opts.weights, opts.head_dim);
        params.assign(model::ParamLayout(shape).total(), 0.0f);
        model::load_hf_gpt2(opts.weights, model::ParamLayout(shape), params.data());
        if (!opts.lora.empty()) {
            const model::AdaptersFileInfo info = model::read_adapters_info(opts.lora);
            const auto whole = model::ParamLayout::adapters(shape, info.lora);
            std::vector<float> adapters(whole.total(), 0.0f);
            model::load_adapters_file(opts.lora, whole, adapters.data());
            model::merge_adapters(model::ParamLayout(shape), params.data(), whole, adapters.data(),
                                  static_cast<float>(info.alpha / info.lora.rank));
        }
    }
    model::Gpt gpt(*ops, shape, 1, 0.0f);
    gpt.load_params(params);
    const auto tokenizer = data::tokenizer_for_vocab(shape.vocab);
    // Each piece as it comes: a long generation shows its progress.
    generate_text(gpt, *tokenizer, opts.prompt, opts.sampling, [](const std::string& piece) {
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
    });
    std::printf("\n");
    return 0;
}

}  // namespace trident::commands
