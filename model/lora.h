// Low-rank adapters on the host: their initialisation, their files and their merging into the
// model (the adapters' layout is model/param_layout.h's ParamLayout::adapters).
//
// An adapters file is safetensors with, for each adapter of the whole model, A (r, in) and B
// (out, r) as F32 under the names of Hugging Face PEFT's GPT-2 or Llama adapters
// ("base_model.model.transformer.h.3.attn.c_attn.lora_A.weight",
// "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight"), and the rank, alpha and
// targets in its metadata; reading also takes the names without that prefix. Only the
// adapters of the targets asked for may be present, each of the rank asked for.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/param_layout.h"

namespace trident::model {

// Initial adapters of the whole model (a buffer of ParamLayout::for_lora(shape, lora)): as
// PEFT starts them, A Kaiming-uniform with a = sqrt(5), i.e. uniform in ±1/sqrt(in), and
// B zero, so that the adapted model starts as the model. A pure function of (seed, tensor,
// element): every split draws the same.
std::vector<float> initial_lora(const ParamLayout& whole_lora, uint64_t seed);

// Fills `values` (whole_lora.total() floats) from an adapters file; throws trident::Error
// naming the file and the tensor that is missing, of the wrong shape or not asked for.
void load_lora_file(const std::string& path, const ParamLayout& whole_lora, float* values);

// Writes the whole model's adapters as an adapters file.
void save_lora_file(const std::string& path, const ParamLayout& whole_lora, const float* values,
                    double alpha);

// What an adapters file's metadata says: the rank, targets and alpha it was trained with.
struct LoraFileInfo {
    LoraShape lora;
    double alpha = 0;
};
// Throws trident::Error naming the file when the metadata lacks them or makes no sense.
LoraFileInfo read_lora_info(const std::string& path);

// The whole model's weights with each adapter merged in: W += scale·B·A, in place on
// `params` (a buffer of `whole_model`).
void merge_lora(const ParamLayout& whole_model, float* params, const ParamLayout& whole_lora,
                const float* adapters, float scale);

}  // namespace trident::model
