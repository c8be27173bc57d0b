// Llama's attention sublayer: grouped-query attention with rotary positions. The column-split
// q, k and v linears run as one (their weights adjacent: this rank's query heads and key/value
// heads), Ops::rotary_qkv_forward rotates q and k at each token's position in the whole
// sequence and gives every query head its group's key/value head, the attention core
// (model/attention_core.h: local, ring or Ulysses) runs on the result as on GPT-2's, and the
// row-split o linear projects back. Qwen3's kind (model/qk_norm_attention.cpp) normalizes each
// query and key head between the linear and the rotation (model/qk_norm.h).
//
// Shapes (this rank, d = H/NH): the linear's output (N, Hm + 2·KVm), KVm = kv_heads·d, in the
// scratch; the rotated, expanded qkv (N, 3Hm) and the core's output (N, Hm) kept for the
// backward; output (R, H), no bias.
//
// With M > KVH this rank's one key/value head is a replica (model/param_layout.h): its k and v
// rows' gradients hold only this rank's query heads' share, and finish_grads sums them over
// the replicas' group (PartContext::kv_replicas), so every replica steps alike.
#pragma once

#include <memory>

#include "model/part_kinds.h"
#include "model/qk_norm.h"
#include "model/self_attention.h"

namespace trident::model {

struct GroupedAttentionSpec {
    LinearSpec qkv, proj;                 // qkv's out: Hm + 2·KVm
    int head_begin = 0, heads_total = 0;  // this rank's query heads among all
    float rope_theta = 10000;             // the rotary base θ
    MakeCore make_core;                   // empty: training's core
    // Qwen3's query and key norms' weights (model/qk_norm.h), or kNoParam: none.
    std::size_t q_norm = kNoParam, k_norm = kNoParam;
    float norm_eps = 1e-6f;
};

class GroupedAttention final : public Attention {
public:
    GroupedAttention(const GroupedAttentionSpec& spec, const Dims& d,
                     const AttentionSavedFn& attention_saved, SetSpec& set, ScratchSpec& scratch);

    kernels::Ptr forward(PartContext& ctx, const Pass& pass, kernels::ConstPtr x,
                         float drop) const override;
    kernels::ConstPtr backward(PartContext& ctx, const Pass& pass, kernels::ConstPtr x,
                               kernels::ConstPtr dy, float drop, BackwardPart part,
                               bool rebuild) const override;
    void backward_weight(PartContext& ctx, const Pass& pass, kernels::ConstPtr x) const override;
    void finish_grads(PartContext& ctx) const override;

private:
    // The positions of this rank's tokens (T) on the device, or null for 0 .. T-1.
    const int32_t* positions(const PartContext& ctx) const;
    // `to` = the rotary op of `from` (the forward: the attention's qkv from the grouped one; the
    // backward: the grouped gradient, added, from the attention's).
    void rotary(PartContext& ctx, const Pass& pass, kernels::Ptr to, kernels::ConstPtr from,
                bool backward) const;

    float theta_;
    int qkv_;                  // slot: the core's qkv (N, 3Hm)
    int grouped_, d_grouped_;  // scratch: the linear's output and its gradient
    int d_qkv_;                // scratch: (N, 3Hm)
    int positions_ = -1;       // scratch: (T) i32, when T < seq_len only
    std::size_t qkv_count_, grouped_count_;
    std::size_t kv_weight_, kv_count_;  // this rank's k and v rows (2·KVm, H), adjacent
    std::unique_ptr<QkNorm> qk_norm_;   // between the linear and the rotation, or none
};

// Llama's kind's tensors for a shape (q_proj, k_proj, v_proj, o_proj), and its attention's spec
// on one rank from the first four tensors of `in`: what a kind built on it starts from.
PartDecl grouped_attention_tensors(const GptShape& s);
GroupedAttentionSpec grouped_attention_spec(const PartBuild& in);
// Llama's kind's activations in Korthikanti et al.'s terms (docs/FORMULAS.md).
ActivationTerms grouped_attention_activations(const GptShape& s, int tensor);

}  // namespace trident::model
