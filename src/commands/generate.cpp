// `trident generate`: prints a continuation of a prompt from trained weights (a Hugging Face
// GPT-2 safetensors file, with low-rank adapters merged in if given, or a checkpoint).
#include <cstdio>

#include "commands/commands.h"
#include "commands/session.h"
#include "config/model_shape.h"
#include "data/tokenizer.h"
#include "kernels/error.h"
#include "kernels/ops.h"
#include "model/gpt.h"
#include "model/hf_gpt2.h"
#include "model/lora.h"
#include "train/checkpoint.h"

namespace trident::commands {

int generate(const GenerateOptions& opts) {
    if (opts.weights.empty() == opts.checkpoint.empty())
        throw Error("give exactly one of --weights F.safetensors and --checkpoint DIR");
    if (opts.sampling.tokens < 1) throw Error("--tokens must be at least 1");
    if (opts.sampling.top_k < 0) throw Error("--top-k must not be negative");
    auto ops = kernels::make_cpu_ops(opts.threads);

    model::GptShape shape;
    std::vector<float> params;
    if (!opts.checkpoint.empty()) {
        train::LoadedModel loaded = train::load_model_checkpoint(opts.checkpoint);
        shape = config::gpt_shape(loaded.cfg);
        params = std::move(loaded.params);
    } else {
        shape = model::infer_hf_gpt2_shape(opts.weights, opts.head_dim);
        params.assign(model::ParamLayout(shape).total(), 0.0f);
        model::load_hf_gpt2(opts.weights, model::ParamLayout(shape), params.data());
        if (!opts.lora.empty()) {
            const model::LoraFileInfo info = model::read_lora_info(opts.lora);
            const auto whole = model::ParamLayout::for_lora(shape, info.lora);
            std::vector<float> adapters(whole.total(), 0.0f);
            model::load_lora_file(opts.lora, whole, adapters.data());
            model::merge_lora(model::ParamLayout(shape), params.data(), whole, adapters.data(),
                              static_cast<float>(info.alpha / info.lora.rank));
        }
    }
    train::GenerationModel whole(*ops, shape);
    whole.gpt().load_params(params);
    const auto tokenizer = data::tokenizer_for_vocab(shape.vocab);
    std::printf("%s\n", generate_text(whole.gpt(), *tokenizer, opts.prompt, opts.sampling).c_str());
    return 0;
}

}  // namespace trident::commands
