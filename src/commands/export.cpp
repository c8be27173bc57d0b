// `trident export`: writes a checkpoint's model as Hugging Face GPT-2 safetensors with its
// config.json beside them (model/hf_config.h), or Llama safetensors (tensors only), or the
// low-rank adapters of a checkpoint that trained them.
#include <cstdio>
#include <filesystem>

#include "commands/commands.h"
#include "config/model_shape.h"
#include "io/output_file.h"
#include "kernels/error.h"
#include "model/hf_config.h"
#include "model/hf_gpt2.h"
#include "model/hf_llama.h"
#include "model/lora.h"
#include "train/checkpoint.h"

namespace trident::commands {

int export_model(const ExportOptions& opts) {
    const std::filesystem::path parent = std::filesystem::path(opts.output).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    const train::LoadedModel loaded = train::load_model_checkpoint(opts.checkpoint);
    const model::GptShape shape = config::gpt_shape(loaded.cfg);
    const bool adapters = !loaded.adapters.empty();
    if (adapters && !opts.merge_lora && !opts.lora_only)
        throw Error(loaded.path +
                    " trained low-rank adapters: export them with --lora-only, or the model "
                    "with them merged in with --merge-lora");
    if (!adapters && (opts.merge_lora || opts.lora_only))
        throw Error(loaded.path + " trained the whole model, not low-rank adapters: export it " +
                    "without " + (opts.merge_lora ? "--merge-lora" : "--lora-only"));
    if (opts.lora_only) {
        const config::LoraConfig& lora = loaded.cfg.training.lora;
        model::save_lora_file(
            opts.output, model::ParamLayout::for_lora(shape, config::lora_of(loaded.cfg).shape),
            loaded.adapters.data(), lora.alpha);
        std::printf("exported the adapters of %s -> %s\n", loaded.path.c_str(),
                    opts.output.c_str());
        return 0;
    }
    if (shape.arch == model::Arch::llama) {
        // Hugging Face Llama's tensor names; its config.json is not written yet.
        io::write_safetensors(
            opts.output,
            model::to_hf_llama_tensors(model::ParamLayout(shape), loaded.params.data()),
            {{"format", "pt"}});
        std::printf("exported %s -> %s\n", loaded.path.c_str(), opts.output.c_str());
        return 0;
    }
    // config.json first: one that is not a GPT-2's (another model's) stops the export before
    // anything is written.
    const std::string config = model::hf_config_path(opts.output);
    if (std::filesystem::exists(config)) {
        try {
            model::read_hf_gpt2_widths(config);
        } catch (const Error& e) {
            throw Error(config + " exists and is not a GPT-2 config.json (" + e.what() +
                        "): export into another directory");
        }
    }
    model::save_hf_gpt2(opts.output, model::ParamLayout(shape), loaded.params.data());
    io::write_file_atomically(config, model::hf_gpt2_config_json(shape, loaded.cfg.model.dropout));
    std::printf("exported %s%s -> %s and %s\n", loaded.path.c_str(),
                adapters ? " (adapters merged in)" : "", opts.output.c_str(), config.c_str());
    // transformers' from_pretrained(DIR) looks for DIR/model.safetensors.
    if (std::filesystem::path(opts.output).filename() != "model.safetensors")
        std::printf(
            "note: transformers' from_pretrained(DIR) reads DIR/model.safetensors: name the "
            "output so for it\n");
    return 0;
}

}  // namespace trident::commands
