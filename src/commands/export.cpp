// `trident export`: writes a checkpoint's model as Hugging Face GPT-2 safetensors.
#include <cstdio>

#include "commands/commands.h"
#include "model/hf_gpt2.h"
#include "train/checkpoint.h"
#include "train/model_shape.h"

namespace trident::commands {

int export_model(const ExportOptions& opts) {
    const train::LoadedModel loaded = train::load_model_checkpoint(opts.checkpoint);
    const model::ParamLayout layout(train::gpt_shape(loaded.cfg));
    model::save_hf_gpt2(opts.output, layout, loaded.params.data());
    std::printf("exported %s -> %s\n", loaded.path.c_str(), opts.output.c_str());
    return 0;
}

}  // namespace trident::commands
