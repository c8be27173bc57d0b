// PEFT's adapter_config.json (see peft_config.h).
#include "model/peft_config.h"

#include <algorithm>
#include <filesystem>

#include "io/json_line.h"

namespace trident::model {

namespace {

// "h.3.attn.c_attn.lora_A.weight" -> "attn.c_attn": the module's last two path parts.
std::string module_suffix(const std::string& adapter_name) {
    const std::string module = adapter_name.substr(0, adapter_name.find(".lora_"));
    const std::size_t last = module.rfind('.');
    const std::size_t before = last == std::string::npos ? last : module.rfind('.', last - 1);
    return before == std::string::npos ? module : module.substr(before + 1);
}

}  // namespace

std::string peft_config_path(const std::string& adapters_file) {
    return (std::filesystem::path(adapters_file).parent_path() / kPeftConfigName).string();
}

std::vector<std::string> peft_target_modules(const ParamLayout& whole_lora) {
    std::vector<std::string> modules;
    for (const ParamTensor& t : whole_lora.tensors()) {
        const std::string m = module_suffix(t.name);
        if (std::find(modules.begin(), modules.end(), m) == modules.end()) modules.push_back(m);
    }
    return modules;
}

std::string peft_adapter_config(const ParamLayout& whole_lora, double alpha, double dropout,
                                const std::string& base) {
    const std::vector<std::string> targets = peft_target_modules(whole_lora);
    io::JsonLine config;
    config.add("peft_type", "LORA")
        .add("task_type", "CAUSAL_LM")
        .add("base_model_name_or_path", base)
        .add("r", whole_lora.lora().rank)
        .add("lora_alpha", alpha)
        .add("lora_dropout", dropout)
        .add("target_modules", std::span<const std::string>(targets))
        .add("fan_in_fan_out", whole_lora.shape().arch != Arch::llama)
        .add("bias", "none")
        .add("use_rslora", false)
        .add("use_dora", false)
        .add("inference_mode", true)
        .add_null("modules_to_save");
    return config.str() + "\n";
}

}  // namespace trident::model
