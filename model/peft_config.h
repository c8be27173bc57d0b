// The adapter_config.json Hugging Face PEFT reads beside an adapters file (model/lora.h), so
// that `PeftModel.from_pretrained` loads adapters trained here: a LoRA config (peft_type LORA,
// task CAUSAL_LM) with the rank, lora_alpha and dropout trained, the base model's path, and
// target_modules naming each adapted linear by the last two parts of its module path
// ("attn.c_attn", "mlp.c_proj", "self_attn.q_proj"), which PEFT matches as a suffix of a
// module's name, so GPT-2's attention and MLP c_proj stay apart. GPT-2's linears are
// Conv1D (weights stored input × output): fan_in_fan_out true there, false for Llama.
// docs/FEATURES.md, "LoRA".
#pragma once

#include <string>
#include <vector>

#include "model/param_layout.h"

namespace trident::model {

inline constexpr const char* kPeftConfigName = "adapter_config.json";
// adapter_config.json in the adapters file's folder.
std::string peft_config_path(const std::string& adapters_file);

// The adapted linears' module suffixes, in the layout's order, each once.
std::vector<std::string> peft_target_modules(const ParamLayout& whole_lora);

// The JSON text of adapter_config.json for the adapters of `whole_lora` (their rank), trained
// with `alpha` and `dropout` over the base at `base` (a file or a folder).
std::string peft_adapter_config(const ParamLayout& whole_lora, double alpha, double dropout,
                                const std::string& base);

}  // namespace trident::model
