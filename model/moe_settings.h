// A mixture of experts' settings (`model.moe`, docs/ARCHITECTURE.md "Mixture of experts"):
// the routed and shared experts of each MoE layer, the router and its balancing, and which
// layers are MoE layers. Read by the config (src/config/schema.cpp) and carried by the model's
// shape (model/model_spec.h, GptShape::moe); experts 0 is a dense model.
#pragma once

namespace trident::model {

// How a token's router logits z become its expert scores: softmax(z) (Mixtral, Qwen3-MoE) or
// sigmoid(z) per expert (DeepSeek-V3).
enum class MoeRouter { softmax, sigmoid };

struct MoeSettings {
    int experts = 0;         // N routed experts per MoE layer; 0: every layer dense
    int top_k = 2;           // k experts per token, 1 <= k <= N
    int ffn_hidden = 0;      // each expert's SwiGLU width; 0: model.ffn_hidden
    int shared_experts = 0;  // S: one always-on SwiGLU of width S·ffn_hidden, added ungated
    MoeRouter router = MoeRouter::softmax;
    bool normalize_top_k = true;  // the k weights divided by their sum
    double scale = 1.0;           // on the weights (DeepSeek's routed_scaling_factor)
    double aux_loss = 0.01;       // the load-balancing loss's coefficient
    double z_loss = 0.0;          // the router z-loss's coefficient
    // DeepSeek-V3's auxiliary-loss-free balancing: the per-expert bias's step (sigmoid only).
    double bias_update_rate = 0.0;
    int first_dense = 0;  // the layers before this one are dense (DeepSeek's first_k_dense_replace)
    int every = 1;        // of the others, every this-many-th is MoE (Qwen's decoder_sparse_step)
    // 0: dropless; c > 0: at most ceil(c·tokens·k/N) assignments per expert and dispatch group.
    double capacity_factor = 0.0;

    bool enabled() const { return experts > 0; }
    // Layer l (from 0) is an MoE layer.
    bool moe_layer(int l) const { return enabled() && l >= first_dense && (l + 1) % every == 0; }
    bool operator==(const MoeSettings&) const = default;
};

}  // namespace trident::model
