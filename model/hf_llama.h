// Hugging Face Llama checkpoints (LlamaForCausalLM's safetensors) to and from our flat
// parameter buffer. Our llama layout holds HF's tensors under HF's names without the "model."
// prefix, linear weights [out, in] as HF's nn.Linear (model/param_layout.h), so the only
// differences are the prefix and the padded vocabulary rows of embed_tokens and lm_head
// (zero on import, dropped on export). A tied model has no lm_head in the file. A mixture of
// experts is written with Mixtral's names where asked (model/hf_moe_config.h: export writes
// a Mixtral folder when hf_family_of says so), else the layout's (Qwen3-MoE's), and read as
// either, Mixtral's names when the file holds block_sparse_moe tensors.
#pragma once

#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/param_layout.h"

namespace trident::model {

// The name of our tensor in HF's files (Mixtral's: its experts' names, model/hf_moe_config.h).
std::string hf_llama_name(const ParamTensor& t, bool mixtral = false);

// Fills `params` (a host buffer of layout.total() floats, a llama layout of the whole model)
// from a HF Llama safetensors file or folder (model/hf_weights.h; F32, F16 or BF16). Every shape is
// checked; a missing or unexpected tensor is an error (HF's rotary inv_freq buffers are not
// parameters and are skipped). Throws trident::Error naming the file and the tensor.
void load_hf_llama(const std::string& path, const ParamLayout& layout, float* params);

// `params` (or gradients) as HF Llama tensors, ready for io::write_safetensors; they point
// into `params`.
std::vector<io::TensorToWrite> to_hf_llama_tensors(const ParamLayout& layout, const float* params,
                                                   bool mixtral = false);

}  // namespace trident::model
