// Hugging Face's LlamaConfig as config.json: written into an exported Llama folder, so that
// transformers' LlamaForCausalLM.from_pretrained(DIR) loads it, and read from a folder given
// to model.init_from or generate --weights for the shapes the tensors' names do not tell.
//
// The fields are LlamaConfig's own arguments (transformers'
// models/llama/configuration_llama.py) plus "model_type", "architectures" and
// "torch_dtype". Trident's llama is theirs without rope_scaling, attention or MLP biases,
// with hidden_act "silu" (head_dim may differ from hidden_size / num_attention_heads, as
// Qwen3's does); a config.json
// asking for any other is refused by name, as is another model_type (qwen2's attention
// biases, mistral's sliding window: none of them is Trident's llama). Qwen3's config.json
// (model_type "qwen3", transformers' Qwen3Config: Llama's fields, its attention's q_norm and
// k_norm, a sliding window that is off) is Trident's llama with model.qk_norm; Mixtral's and
// Qwen3-MoE's are its mixtures of experts (model/hf_moe_config.h).
#pragma once

#include <string>

#include "model/hf_moe_config.h"
#include "model/param_layout.h"

namespace trident::model {

// What a Llama config.json says of the model, under our names.
struct HfLlamaConfig {
    int vocab = 0;          // vocab_size
    int hidden = 0;         // hidden_size
    int layers = 0;         // num_hidden_layers
    int heads = 0;          // num_attention_heads
    int kv_heads = 0;       // num_key_value_heads (absent: heads)
    int ffn = 0;            // intermediate_size
    int max_positions = 0;  // max_position_embeddings (absent: 2048, LlamaConfig's default)
    double rope_theta = 10000.0;
    double norm_eps = 1e-6;  // rms_norm_eps (absent: LlamaConfig's default 1e-6)
    bool tied = false;       // tie_word_embeddings
    int eos = -1;            // eos_token_id, a list's first (absent or null: -1)
    // model_type "qwen3" (Qwen3ForCausalLM): Llama's with q_norm and k_norm (model.qk_norm).
    bool qk_norm = false;
    // "mixtral" and "qwen3_moe" (with q_norm and k_norm): a mixture of experts
    // (model/hf_moe_config.h).
    MoeSettings moe{};
    int head_dim = 0;  // head_dim where it is not hidden_size / num_attention_heads, else 0
    bool operator==(const HfLlamaConfig&) const = default;
    // The family it is written as (hf_family_of).
    HfFamily family() const { return hf_family_of(qk_norm, moe, ffn); }
};

// The "model_type" of the config.json at `path` ("" when it has none). Throws trident::Error
// naming the file when it cannot be read or is not a JSON object.
std::string read_hf_model_type(const std::string& path);

// The Llama config.json at `path`; throws trident::Error naming the file and the field for a
// missing or malformed shape, another model_type, or a feature Trident's llama lacks.
HfLlamaConfig read_hf_llama_config(const std::string& path);

// config.json's text for `c`, tensors stored as float32.
std::string hf_llama_config_json(const HfLlamaConfig& c);

// The model `c` describes, `max_seq` positions long (vocabulary padded to a multiple of 128).
GptShape hf_llama_shape(const HfLlamaConfig& c, int max_seq);

}  // namespace trident::model
