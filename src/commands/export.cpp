// `trident export`: writes a checkpoint's model as Hugging Face GPT-2 (or Llama) safetensors, or
// the low-rank adapters of a checkpoint that trained them.
#include <cstdio>

#include "commands/commands.h"
#include "config/model_shape.h"
#include "kernels/error.h"
#include "model/hf_gpt2.h"
#include "model/hf_llama.h"
#include "model/lora.h"
#include "train/checkpoint.h"

namespace trident::commands {

int export_model(const ExportOptions& opts) {
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
    if (shape.arch == model::Arch::llama)
        io::write_safetensors(
            opts.output,
            model::to_hf_llama_tensors(model::ParamLayout(shape), loaded.params.data()),
            {{"format", "pt"}});
    else
        model::save_hf_gpt2(opts.output, model::ParamLayout(shape), loaded.params.data());
    std::printf("exported %s%s -> %s\n", loaded.path.c_str(),
                adapters ? " (adapters merged in)" : "", opts.output.c_str());
    return 0;
}

}  // namespace trident::commands
