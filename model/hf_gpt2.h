// Hugging Face GPT-2 checkpoints (safetensors) to and from our flat parameter buffer.
//
// HF's GPT-2 differs from model/param_layout.h in three ways, all undone here:
//  - its attention and MLP weights are Conv1D, stored [in, out]; ours are [out, in] like
//    torch.nn.Linear, so those four weights per layer are transposed both ways;
//  - its wte has `vocab` rows; ours has `padded_vocab` (padded rows are zero on import and
//    dropped on export);
//  - its keys may carry a "transformer." prefix and include the causal-mask buffers
//    h.N.attn.bias / h.N.attn.masked_bias, which are not parameters.
// Trident ties the LM head to wte, so an lm_head.weight is accepted only if it equals wte.
#pragma once

#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/param_layout.h"

namespace trident::model {

// Fills `params` (a host buffer of layout.total() floats) from a HF GPT-2 safetensors file
// (F32, F16 or BF16). Every shape is checked against the layout; missing or unexpected tensors
// are errors. wpe may have more rows than max_seq (the first max_seq are taken), not fewer.
// Throws trident::Error naming the file and the tensor.
void load_hf_gpt2(const std::string& path, const ParamLayout& layout, float* params);

// The model shape a HF GPT-2 file holds (vocabulary padded to a multiple of 128). The head
// count leaves no trace in the shapes: it is hidden / head_dim (64 throughout GPT-2's family).
GptShape infer_hf_gpt2_shape(const std::string& path, int head_dim = 64);

// `params` (or gradients) as HF GPT-2 tensors, ready for io::write_safetensors; `tensors`
// point into `params` or into `transposed`, so both must outlive their use.
struct HfTensors {
    std::vector<io::TensorToWrite> tensors;
    std::vector<std::vector<float>> transposed;  // the Conv1D weights in HF's (in, out) layout
};
HfTensors to_hf_tensors(const ParamLayout& layout, const float* params);

// Writes `params` (or a gradient buffer of the same layout) as a HF GPT-2 safetensors file:
// "transformer."-prefixed keys, HF shapes, F32, no lm_head (tied), metadata {"format": "pt"}.
void save_hf_gpt2(const std::string& path, const ParamLayout& layout, const float* params);

}  // namespace trident::model
