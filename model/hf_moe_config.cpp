// Hugging Face's mixtures of experts in config.json (see hf_moe_config.h).
#include "model/hf_moe_config.h"

#include <vector>

namespace trident::model {

namespace {

// transformers' default router_aux_loss_coef (MixtralConfig, Qwen3MoeConfig).
constexpr double kHfAuxLoss = 0.001;

void read_mixtral(const HfFields& f, MoeSettings& m, int ffn) {
    m.experts = f.positive("num_local_experts");
    m.ffn_hidden = ffn;  // the experts are intermediate_size wide
    if (f.find("sliding_window")) f.refuse("sliding_window is set (Mixtral's windowed attention)");
    if (f.non_negative("router_jitter_noise", 0) > 0)
        f.refuse("router_jitter_noise is above 0 (noise on the router's input)");
}

// mlp_only_layers must be the first layers: model.moe.first_dense of them.
int first_dense(const HfFields& f) {
    const std::vector<int> dense = f.integers("mlp_only_layers");
    for (std::size_t i = 0; i < dense.size(); ++i)
        if (dense[i] != static_cast<int>(i))
            f.refuse(
                "mlp_only_layers is not the first layers 0, 1, ... (dense layers "
                "between MoE layers)");
    return static_cast<int>(dense.size());
}

void read_qwen3_moe(const HfFields& f, MoeSettings& m, int ffn) {
    m.experts = f.positive("num_experts");
    m.ffn_hidden = f.positive("moe_intermediate_size", ffn);
    m.normalize_top_k = f.flag("norm_topk_prob", false);
    m.every = f.positive("decoder_sparse_step", 1);
    m.first_dense = first_dense(f);
    m.shared_experts = static_cast<int>(f.non_negative("n_shared_experts", 0));
    const std::string scoring = f.text("scoring_func", "softmax");
    if (scoring != "softmax" && scoring != "sigmoid")
        f.refuse("scoring_func is \"" + scoring + "\" (routers: softmax, sigmoid)");
    m.router = scoring == "sigmoid" ? MoeRouter::sigmoid : MoeRouter::softmax;
    m.scale = f.number("routed_scaling_factor", 1.0);
}

}  // namespace

const char* hf_model_type(HfFamily family) {
    switch (family) {
        case HfFamily::qwen3:
            return "qwen3";
        case HfFamily::mixtral:
            return "mixtral";
        case HfFamily::qwen3_moe:
            return "qwen3_moe";
        case HfFamily::llama:
            break;
    }
    return "llama";
}

const char* hf_architecture(HfFamily family) {
    switch (family) {
        case HfFamily::qwen3:
            return "Qwen3ForCausalLM";
        case HfFamily::mixtral:
            return "MixtralForCausalLM";
        case HfFamily::qwen3_moe:
            return "Qwen3MoeForCausalLM";
        case HfFamily::llama:
            break;
    }
    return "LlamaForCausalLM";
}

HfFamily hf_family_of(bool qk_norm, const MoeSettings& moe, int ffn) {
    if (!moe.enabled()) return qk_norm ? HfFamily::qwen3 : HfFamily::llama;
    const bool mixtral = !qk_norm && moe.shared_experts == 0 && moe.router == MoeRouter::softmax &&
                         moe.normalize_top_k && moe.every == 1 && moe.first_dense == 0 &&
                         (moe.ffn_hidden == 0 || moe.ffn_hidden == ffn) && moe.scale == 1.0;
    return mixtral ? HfFamily::mixtral : HfFamily::qwen3_moe;
}

MoeSettings read_hf_moe(const HfFields& f, HfFamily family, int layers, int ffn) {
    MoeSettings m;
    if (family == HfFamily::mixtral) read_mixtral(f, m, ffn);
    if (family == HfFamily::qwen3_moe) read_qwen3_moe(f, m, ffn);
    if (!m.enabled()) return m;
    m.top_k = f.positive("num_experts_per_tok");
    m.aux_loss = f.non_negative("router_aux_loss_coef", kHfAuxLoss);
    if (m.top_k > m.experts)
        f.refuse("num_experts_per_tok " + std::to_string(m.top_k) + " is above the " +
                 std::to_string(m.experts) + " experts");
    if (m.first_dense > layers) f.refuse("mlp_only_layers lists more layers than the model has");
    return m;
}

void write_hf_moe(io::JsonLine& j, HfFamily family, const MoeSettings& moe, int ffn) {
    if (family == HfFamily::mixtral) {
        j.add("num_local_experts", moe.experts)
            .add_null("sliding_window")
            .add("router_jitter_noise", 0.0)
            .add("output_router_logits", false);
    } else {
        std::vector<int64_t> dense(static_cast<std::size_t>(moe.first_dense));
        for (std::size_t i = 0; i < dense.size(); ++i) dense[i] = static_cast<int64_t>(i);
        j.add("num_experts", moe.experts)
            .add("moe_intermediate_size", moe.ffn_hidden > 0 ? moe.ffn_hidden : ffn)
            .add("norm_topk_prob", moe.normalize_top_k)
            .add("decoder_sparse_step", moe.every)
            .add("mlp_only_layers", std::span<const int64_t>(dense));
        if (moe.shared_experts > 0) j.add("n_shared_experts", moe.shared_experts);
        if (moe.router == MoeRouter::sigmoid) j.add("scoring_func", "sigmoid");
        if (moe.scale != 1.0) j.add_exact("routed_scaling_factor", moe.scale);
    }
    j.add("num_experts_per_tok", moe.top_k).add_exact("router_aux_loss_coef", moe.aux_loss);
}

std::string mixtral_name(const std::string& ours) {
    const std::string gate = ".mlp.gate.", experts = ".mlp.experts.";
    std::string name = ours;
    if (const auto at = name.find(gate); at != std::string::npos)
        return name.replace(at, gate.size(), ".block_sparse_moe.gate.");
    const auto at = name.find(experts);
    if (at == std::string::npos) return name;
    name.replace(at, experts.size(), ".block_sparse_moe.experts.");
    for (const auto& [from, to] :
         {std::pair{".gate_proj.", ".w1."}, std::pair{".down_proj.", ".w2."},
          std::pair{".up_proj.", ".w3."}})
        if (const auto p = name.find(from); p != std::string::npos)
            return name.replace(p, std::string(from).size(), to);
    return name;
}

}  // namespace trident::model
