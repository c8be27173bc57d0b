// Hugging Face's mixtures of experts in a llama-family config.json (docs/ARCHITECTURE.md,
// "Mixture of experts"), read into and written from model.moe:
// - MixtralForCausalLM (model_type "mixtral", transformers' MixtralConfig): num_local_experts,
//   num_experts_per_tok, router_aux_loss_coef; every layer an MoE layer of intermediate_size
//   experts, the top k always normalized, no shared experts; its sliding window must be off.
// - Qwen3MoeForCausalLM (model_type "qwen3_moe", Qwen3MoeConfig; Qwen3's q_norm and k_norm):
//   num_experts, num_experts_per_tok, moe_intermediate_size (the experts' width;
//   intermediate_size is the dense layers'), norm_topk_prob (false when absent, as
//   transformers' default), decoder_sparse_step (model.moe.every) and mlp_only_layers, which
//   must be the first layers (model.moe.first_dense). DeepSeek-V3's MoE keys on such a folder:
//   n_shared_experts, scoring_func ("softmax" or "sigmoid") and routed_scaling_factor.
// router_aux_loss_coef is read into model.moe.aux_loss, although transformers pools every
// layer's routing into one balancing term where Trident sums the layers' terms.
//
// Mixtral's files name an MoE layer's tensors block_sparse_moe.gate and
// block_sparse_moe.experts.{e}.w1 (gate_proj), w2 (down_proj), w3 (up_proj); Qwen3-MoE's and
// DeepSeek's are the layout's own (mlp.gate, mlp.experts.{e}.gate_proj, ...).
#pragma once

#include <string>

#include "io/json_line.h"
#include "model/hf_config_fields.h"
#include "model/moe_settings.h"

namespace trident::model {

enum class HfFamily { llama, qwen3, mixtral, qwen3_moe };

const char* hf_model_type(HfFamily family);
const char* hf_architecture(HfFamily family);

// The family a model is written as: Mixtral when its mixture is Mixtral's (softmax, top k
// normalized, every layer, experts as wide as ffn, no shared experts or scale) and it has no
// q/k norms, else Qwen3-MoE; a dense model Qwen3's with q/k norms, else Llama's.
HfFamily hf_family_of(bool qk_norm, const MoeSettings& moe, int ffn);

// The mixture a "mixtral" or "qwen3_moe" config.json describes over `layers` layers of dense
// width `ffn`; throws trident::Error naming the file and the key it cannot take.
MoeSettings read_hf_moe(const HfFields& f, HfFamily family, int layers, int ffn);

// The mixture's keys for `family`'s config.json.
void write_hf_moe(io::JsonLine& j, HfFamily family, const MoeSettings& moe, int ffn);

// Our tensor's name ("layers.0.mlp.experts.3.up_proj.weight") as Mixtral's files name it
// ("layers.0.block_sparse_moe.experts.3.w3.weight"); other names unchanged.
std::string mixtral_name(const std::string& ours);

}  // namespace trident::model
