// `trident generate`: prints a continuation of a prompt from trained weights (Hugging Face
// GPT-2 or Llama safetensors, a file or a model folder, with low-rank adapters merged in if
// given, or a checkpoint).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <tuple>

#include "commands/commands.h"
#include "commands/session.h"
#include "config/model_shape.h"
#include "data/tokenizer.h"
#include "io/user_paths.h"
#include "kernels/error.h"
#include "kernels/ops.h"
#include "kernels/threads.h"
#include "model/gpt.h"
#include "model/hf_config.h"
#include "model/hf_gpt2.h"
#include "model/hf_llama.h"
#include "model/hf_llama_config.h"
#include "model/hf_weights.h"
#include "model/lora.h"
#include "train/checkpoint.h"
#include "train/metrics.h"

namespace trident::commands {

namespace {

namespace fs = std::filesystem;

// The config.json of --weights: inside a folder, or beside a file.
std::string config_of(const std::string& weights) {
    return fs::is_directory(weights) ? (fs::path(weights) / "config.json").string()
                                     : model::hf_config_path(weights);
}

// --head-dim must agree with config.json's hidden / heads (named as config.json names them)
// when both are given.
void check_head_dim(const GenerateOptions& opts, int hidden, int heads, const std::string& config,
                    const char* ratio) {
    if (opts.head_dim > 0 && opts.head_dim * heads != hidden)
        throw Error("--head-dim " + std::to_string(opts.head_dim) + " disagrees with " + config +
                    " (" + ratio + " = " + std::to_string(hidden / heads) + "); leave it out");
}

// --head-dim, else n_embd / n_head of the config.json, else GPT-2's 64.
int gpt2_head_dim(const GenerateOptions& opts, const std::string& config) {
    if (!fs::exists(config)) return opts.head_dim > 0 ? opts.head_dim : 64;
    const model::HfGpt2Config c = model::read_hf_gpt2_config(config);
    if (c.hidden % c.heads != 0)
        throw Error(config + ": n_embd " + std::to_string(c.hidden) +
                    " is not a multiple of n_head " + std::to_string(c.heads));
    check_head_dim(opts, c.hidden, c.heads, config, "n_embd / n_head");
    return c.hidden / c.heads;
}

// A config.json beside GPT-2 weights whose shape is not their tensors' describes another
// model: refused, where the shape taken from the tensors would hide the mismatch.
void check_gpt2_config(const std::string& config, const model::GptShape& shape) {
    std::error_code error;
    if (!fs::exists(config, error)) return;
    const model::HfGpt2Config c = model::read_hf_gpt2_config(config);
    const std::tuple<const char*, int, int> sizes[] = {
        {"n_embd", c.hidden, shape.hidden},
        {"n_layer", c.layers, shape.layers},
        {"n_inner", c.ffn, shape.ffn},
        {"n_positions", c.max_positions, shape.max_seq},
        {"vocab_size", c.vocab, shape.vocab}};
    for (const auto& [key, said, held] : sizes)
        if (said != held)
            throw Error(config + ": " + key + " is " + std::to_string(said) +
                        ", but the weights beside it hold " + std::to_string(held) +
                        ": it describes another model; correct it or remove it");
}

// Weights holding a NaN or an infinity give no text worth printing (training stops at the
// step that makes one): refused, naming the tensor.
void check_finite(const model::GptShape& shape, const std::vector<float>& params,
                  const std::string& source) {
    const model::ParamLayout layout(shape);
    for (const model::ParamTensor& t : layout.tensors())
        for (std::size_t i = 0; i < t.numel; ++i)
            if (!std::isfinite(params[t.offset + i]))
                throw Error(source + ": tensor " + t.name + " holds a non-finite value (" +
                            std::to_string(params[t.offset + i]) + " at element " +
                            std::to_string(i) + "): no text can be generated from it");
}

// The model of --weights, its shapes from config.json (a llama's all; a GPT-2's from the
// tensors, its heads from config.json or --head-dim) and its weights from the file or folder.
void load_weights(const GenerateOptions& opts, model::GptShape& shape, std::vector<float>& params) {
    const std::string config = config_of(opts.weights);
    // A config.json of another model_type is read as a Llama's, which refuses it by name.
    const std::string type = fs::exists(config) ? model::read_hf_model_type(config) : "";
    if (!type.empty() && type != "gpt2") {
        const model::HfLlamaConfig c = model::read_hf_llama_config(config);
        check_head_dim(opts, c.heads * (c.head_dim > 0 ? c.head_dim : c.hidden / c.heads), c.heads,
                       config, "head_dim, else hidden_size / num_attention_heads");
        shape = model::hf_llama_shape(c, c.max_positions);
        params.assign(model::ParamLayout(shape).total(), 0.0f);
        model::load_hf_llama(opts.weights, model::ParamLayout(shape), params.data());
        return;
    }
    const std::string file = fs::is_directory(opts.weights)
                                 ? (fs::path(opts.weights) / model::kHfWeightsName).string()
                                 : opts.weights;
    shape = model::infer_hf_gpt2_shape(file, gpt2_head_dim(opts, config));
    check_gpt2_config(config, shape);
    params.assign(model::ParamLayout(shape).total(), 0.0f);
    model::load_hf_gpt2(file, model::ParamLayout(shape), params.data());
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
    for (const auto& [path, option] : {std::pair{opts.weights, "--weights"},
                                       {opts.checkpoint, "--checkpoint"},
                                       {opts.lora, "--lora"}})
        if (!path.empty()) io::check_input_path(path, option);
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
    const kernels::ThreadCount threads = kernels::thread_count(opts.threads, "--threads");
    if (!threads.note.empty()) warn(threads.note);
    auto ops = kernels::make_cpu_ops(threads.count);

    model::GptShape shape;
    std::vector<float> params;
    train::SamplingOptions sampling = opts.sampling;
    if (!opts.checkpoint.empty()) {
        train::LoadedModel loaded = train::load_model_checkpoint(opts.checkpoint);
        if (!opts.lora.empty() && !loaded.adapters.empty())
            throw Error(loaded.path +
                        " trained low-rank adapters of its own (merged in already): --lora "
                        "takes a checkpoint of a whole model");
        shape = config::gpt_shape(loaded.cfg);
        params = std::move(loaded.params);
        sampling.eod = train::generation_eod(loaded.cfg.data);
    } else {
        load_weights(opts, shape, params);
    }
    if (!opts.lora.empty()) merge_lora_file(opts.lora, shape, params);
    check_finite(shape, params, opts.weights.empty() ? opts.checkpoint : opts.weights);
    train::GenerationModel whole(*ops, shape, params);
    const auto tokenizer = data::tokenizer_for_vocab(shape.vocab);
    const train::SamplingOptions& o = sampling;
    const std::string tokens = train::counted(o.tokens, "token");
    if (o.temperature == 0)
        std::fprintf(stderr, "generate: %s, greedy (temperature 0)\n", tokens.c_str());
    else
        std::fprintf(stderr, "generate: %s, temperature %g, top-k %d%s, seed %llu\n",
                     tokens.c_str(), o.temperature, o.top_k, o.top_k == 0 ? " (all)" : "",
                     static_cast<unsigned long long>(o.seed));
    // Each piece as it comes: a long generation shows its progress.
    if (o.eod >= 0)
        std::fprintf(stderr,
                     "generate: packed documents (the checkpoint's data.documents: mask): a "
                     "token sees its own document, which ends after token %d\n",
                     static_cast<int>(o.eod));
    generate_text(whole.decoder(), *tokenizer, opts.prompt, sampling, [](const std::string& piece) {
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
    });
    std::printf("\n");
    return 0;
}

}  // namespace trident::commands
