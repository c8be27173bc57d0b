// The kind "grouped_qk_norm" (model.qk_norm: true; Hugging Face's Qwen3Attention): Llama's
// grouped-query attention with an RMSNorm over each query and key head before the rotation
// (model/qk_norm.h). Tensors under the layer's self_attn: Llama's q_proj, k_proj, v_proj and
// o_proj, then q_norm.weight and k_norm.weight (head size each, replicated, not decayed).
#include "model/grouped_attention.h"

namespace trident::model {

namespace {

PartDecl qk_norm_attention_tensors(const GptShape& s) {
    PartDecl decl = grouped_attention_tensors(s);
    const int64_t hs = s.head_size();
    decl.tensors.push_back({"q_norm.weight", {hs}, {}, Init::ones, false});
    decl.tensors.push_back({"k_norm.weight", {hs}, {}, Init::ones, false});
    return decl;
}

std::unique_ptr<Attention> build_qk_norm_attention(const PartBuild& in) {
    GroupedAttentionSpec a = grouped_attention_spec(in);
    a.q_norm = in.tensor(4);
    a.k_norm = in.tensor(5);
    a.norm_eps = in.shape().norm_eps;
    return std::make_unique<GroupedAttention>(a, in.d, in.options.attention_saved, in.set,
                                              in.scratch);
}

// Llama's terms (docs/FORMULAS.md) and the norms' inputs kept, 2 bytes an element of Q and of
// K: 2 + 2·g/a, split.
ActivationTerms qk_norm_attention_activations(const GptShape& s, int tensor) {
    ActivationTerms t = grouped_attention_activations(s, tensor);
    const double g_over_a =
        static_cast<double>(s.kv_heads) * kv_replicas(s.kv_heads, tensor) / s.heads;
    t.split += 2 + 2 * g_over_a;
    return t;
}

}  // namespace

extern const AttentionKind qk_norm_attention_kind{"grouped_qk_norm",
                                                  qk_norm_attention_tensors,
                                                  build_qk_norm_attention,
                                                  qk_norm_attention_activations,
                                                  true,
                                                  true,
                                                  true};

}  // namespace trident::model
