// Where our tensor names meet Hugging Face's: the prefix each family's transformers class puts
// before the names our layout gives (GPT2LMHeadModel's "transformer.", LlamaForCausalLM's
// "model."; the LM head has none), and PEFT's wrapper before that. The Hugging Face mappers
// (model/hf_gpt2.h, model/hf_llama.h) and the adapters' files (model/lora.h) name tensors
// through these alone.
#pragma once

#include <string>

#include "kernels/error.h"
#include "model/model_spec.h"

namespace trident::model {

inline std::string hf_prefix(Arch arch) {
    return arch == Arch::llama ? "model." : "transformer.";
}

// PEFT's names of an adapter: its wrapper's prefix, then the model's own.
inline std::string peft_prefix(Arch arch) {
    return "base_model.model." + hf_prefix(arch);
}

// A model Hugging Face's class of its family holds: its MLP must be the family's own (GPT-2's
// GELU, Llama's SwiGLU); `what` ("export", "import") names the refused act.
inline void check_hf_family(const GptShape& shape, const char* what) {
    if (family_mlp(shape)) return;
    throw Error(std::string("model.mlp: ") + shape.mlp + " has no Hugging Face " +
                (shape.arch == Arch::llama ? "LlamaForCausalLM" : "GPT2LMHeadModel") +
                " equivalent (its MLP is " + default_mlp(shape.arch) + "): no " + what +
                " of this model in Hugging Face's format");
}

}  // namespace trident::model
