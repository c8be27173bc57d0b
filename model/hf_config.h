// Hugging Face's GPT2Config as config.json: written beside exported weights, so that
// transformers' GPT2LMHeadModel.from_pretrained(DIR) loads them, and read back for what the
// weights' shapes do not tell, the head count.
//
// The fields are exactly GPT2Config's own arguments (transformers'
// models/gpt2/configuration_gpt2.py) plus "model_type" and "architectures", which
// AutoConfig and from_pretrained look for. Trident's GPT-2 is theirs with
// activation_function "gelu_new" (GELU, tanh form), layer_norm_epsilon 1e-5 and the LM head
// tied to wte; model.dropout is on the embeddings and both residual branches (embd_pdrop,
// resid_pdrop) and none on attention's probabilities (attn_pdrop 0).
#pragma once

#include <string>

#include "io/json_reader.h"
#include "model/param_layout.h"

namespace trident::model {

// "DIR/config.json" for weights "DIR/F.safetensors".
std::string hf_config_path(const std::string& weights);

// The JSON object of a config.json; throws trident::Error naming the file when it cannot be
// read or is no JSON object.
io::json::Value read_hf_config_file(const std::string& path);

// The config.json text of a GPT-2 of `shape` (its real vocabulary) with `dropout`.
std::string hf_gpt2_config_json(const GptShape& shape, double dropout);

// What a GPT-2 config.json says of the model, under our names.
struct HfGpt2Config {
    int vocab = 0;          // vocab_size
    int max_positions = 0;  // n_positions: rows of wpe
    int hidden = 0;         // n_embd
    int layers = 0;         // n_layer
    int heads = 0;          // n_head
    int ffn = 0;            // n_inner (null: 4 × n_embd)
};
// Throws trident::Error naming the file when it cannot be read or is no GPT-2 config.
HfGpt2Config read_hf_gpt2_config(const std::string& path);

}  // namespace trident::model
