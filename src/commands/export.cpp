// `trident export`: writes a checkpoint's model as Hugging Face safetensors, GPT-2 or Llama as
// the checkpoint's model.arch, with its config.json (model/hf_config.h,
// model/hf_llama_config.h): one file with config.json beside it, or (--format hf) a model
// folder as transformers' save_pretrained writes it, Llama weights sharded above a size
// (model/hf_weights.h). Or the low-rank adapters of a checkpoint that trained them, with
// PEFT's adapter_config.json beside them (model/peft_config.h).
#include <cstdio>
#include <filesystem>

#include "commands/commands.h"
#include "config/model_shape.h"
#include "io/output_file.h"
#include "io/user_paths.h"
#include "kernels/error.h"
#include "model/hf_config.h"
#include "model/hf_gpt2.h"
#include "model/hf_llama.h"
#include "model/hf_llama_config.h"
#include "model/hf_weights.h"
#include "model/lora.h"
#include "model/peft_config.h"
#include "train/checkpoint.h"

namespace trident::commands {

namespace {

namespace fs = std::filesystem;

bool is_llama(const train::LoadedModel& loaded) {
    return loaded.cfg.model.arch == model::Arch::llama;
}

std::string config_json(const train::LoadedModel& loaded) {
    return is_llama(loaded) ? model::hf_llama_config_json(config::hf_llama_config(loaded.cfg))
                            : model::hf_gpt2_config_json(config::gpt_shape(loaded.cfg),
                                                         loaded.cfg.model.dropout);
}

// A mixture of experts in Mixtral's format (model/hf_moe_config.h); one no Hugging Face family
// states is refused before anything is written.
bool mixtral(const train::LoadedModel& loaded) {
    const model::HfLlamaConfig c = config::hf_llama_config(loaded.cfg);
    if (c.moe.enabled() && !c.qk_norm && c.family() != model::HfFamily::mixtral)
        throw Error(loaded.path +
                    ": model.moe: a mixture of experts other than Mixtral's is Qwen3-MoE's in "
                    "Hugging Face's format, whose attention has q_norm and k_norm, which this "
                    "model has not (model.qk_norm false): no export of it");
    return c.family() == model::HfFamily::mixtral;
}

// A config.json already beside the output must be one of the same model kind: another model's
// stops the export before anything is written.
void check_config_beside(const std::string& config, const train::LoadedModel& loaded) {
    if (!fs::exists(config)) return;
    const std::string kind =
        is_llama(loaded) ? model::hf_model_type(config::hf_llama_config(loaded.cfg).family())
                         : "gpt2";
    std::string type;
    try {
        type = model::read_hf_model_type(config);
    } catch (const Error& e) {
        throw Error(config + " exists and is not a config.json (" + e.what() +
                    "): export into another directory");
    }
    if (type != kind)
        throw Error(config + " exists and is not a " + kind + " config.json (model_type \"" + type +
                    "\"): export into another directory");
}

// One .safetensors file and config.json beside it.
void export_file(const ExportOptions& opts, const train::LoadedModel& loaded) {
    const std::string config = model::hf_config_path(opts.output);
    check_config_beside(config, loaded);
    const model::ParamLayout layout(config::gpt_shape(loaded.cfg));
    if (is_llama(loaded))
        io::write_safetensors(
            opts.output, model::to_hf_llama_tensors(layout, loaded.params.data(), mixtral(loaded)),
            {{"format", "pt"}});
    else
        model::save_hf_gpt2(opts.output, layout, loaded.params.data());
    io::write_file_atomically(config, config_json(loaded));
    std::printf("exported %s%s -> %s and %s\n", loaded.path.c_str(),
                loaded.adapters.empty() ? "" : " (adapters merged in)", opts.output.c_str(),
                config.c_str());
    // transformers' from_pretrained(DIR) looks for DIR/model.safetensors.
    if (fs::path(opts.output).filename() != model::kHfWeightsName)
        std::printf(
            "note: transformers' from_pretrained(DIR) reads DIR/model.safetensors: name the "
            "output so for it, or export with --format hf\n");
}

// A Hugging Face model folder: the weights first, config.json last, so that a folder with a
// config.json is complete. GPT-2 weights are one file whatever their size.
void export_folder(const ExportOptions& opts, const train::LoadedModel& loaded) {
    const fs::path dir(opts.output);  // made, empty (check_output)
    const model::ParamLayout layout(config::gpt_shape(loaded.cfg));
    std::vector<std::string> written;
    if (is_llama(loaded)) {
        written = model::write_hf_weights(
            opts.output, model::to_hf_llama_tensors(layout, loaded.params.data(), mixtral(loaded)),
            opts.shard_bytes);
    } else {
        written.push_back((dir / model::kHfWeightsName).string());
        model::save_hf_gpt2(written.back(), layout, loaded.params.data());
    }
    io::write_file_atomically((dir / "config.json").string(), config_json(loaded));
    const std::string weights =
        written.size() == 1 ? std::string(model::kHfWeightsName)
                            : std::to_string(written.size() - 1) + " shards and their index";
    std::printf("exported %s%s -> %s (config.json, %s)\n", loaded.path.c_str(),
                loaded.adapters.empty() ? "" : " (adapters merged in)", opts.output.c_str(),
                weights.c_str());
}

// What --output names, checked before the checkpoint is read: a new or empty folder (--format
// hf), else a file (and config.json beside it, but for --lora-only) that is a regular file or
// none, in a directory that can be written (io/user_paths.h).
void check_output(const ExportOptions& opts) {
    if (opts.format == "hf") {
        io::check_path_text(opts.output, "--output");
        const fs::path dir(opts.output);
        std::error_code error;
        if (fs::exists(dir, error) && (!fs::is_directory(dir, error) || !fs::is_empty(dir, error)))
            throw Error("--output: " + io::shown(opts.output) +
                        " exists and is not an empty folder: --format hf writes a new folder "
                        "(stale shards beside new ones would mix two models)");
        io::check_output_directory(opts.output, "--output");
        return;
    }
    io::check_output_file(opts.output, "--output");
    io::check_output_file(
        opts.lora_only ? model::peft_config_path(opts.output) : model::hf_config_path(opts.output),
        "--output");
}

// The adapters file and PEFT's adapter_config.json beside it (model/peft_config.h).
void export_adapters(const ExportOptions& opts, const train::LoadedModel& loaded) {
    const config::LoraConfig& lora = loaded.cfg.training.lora;
    const model::ParamLayout whole_lora = model::ParamLayout::for_lora(
        config::gpt_shape(loaded.cfg), config::lora_of(loaded.cfg).shape);
    model::save_lora_file(opts.output, whole_lora, loaded.adapters.data(), lora.alpha);
    const std::string base = fs::absolute(loaded.base).lexically_normal().string();
    io::write_file_atomically(
        model::peft_config_path(opts.output),
        model::peft_adapter_config(whole_lora, lora.alpha, lora.dropout, base));
    std::printf("exported the adapters of %s -> %s (and PEFT's %s beside it)\n",
                loaded.path.c_str(), opts.output.c_str(), model::kPeftConfigName);
}

}  // namespace

int export_model(const ExportOptions& opts) {
    if (opts.format != "safetensors" && opts.format != "hf")
        throw Error("--format must be safetensors or hf, got '" + io::shown(opts.format) + "'");
    if (opts.format == "hf" && opts.lora_only)
        throw Error("--lora-only writes one adapters file: leave out --format hf");
    if (opts.shard_bytes < 1) throw Error("--shard-size must be at least 1 byte");
    io::check_input_path(opts.checkpoint, "--checkpoint");
    check_output(opts);
    const train::LoadedModel loaded = train::load_model_checkpoint(opts.checkpoint);
    const bool adapters = !loaded.adapters.empty();
    if (adapters && !opts.merge_lora && !opts.lora_only)
        throw Error(loaded.path +
                    " trained low-rank adapters: export them with --lora-only, or the model "
                    "with them merged in with --merge-lora");
    if (!adapters && (opts.merge_lora || opts.lora_only))
        throw Error(loaded.path + " trained the whole model, not low-rank adapters: export it " +
                    "without " + (opts.merge_lora ? "--merge-lora" : "--lora-only"));
    if (opts.lora_only) {
        export_adapters(opts, loaded);
        return 0;
    }
    if (opts.format == "hf")
        export_folder(opts, loaded);
    else
        export_file(opts, loaded);
    return 0;
}

}  // namespace trident::commands
