// Llama's attention sublayer (see grouped_attention.h).
#include "model/grouped_attention.h"

#include "model/documents.h"
#include "model/part_kinds.h"

namespace trident::model {

using kernels::ConstPtr;
using kernels::Ptr;

GroupedAttention::GroupedAttention(const GroupedAttentionSpec& spec, const Dims& d,
                                   const AttentionSavedFn& attention_saved, SetSpec& set,
                                   ScratchSpec& scratch)
    : Attention(spec.qkv, spec.proj, spec.head_begin, spec.heads_total, spec.make_core, d,
                attention_saved, set, scratch),
      theta_(spec.rope_theta),
      qkv_count_(d.rows() * 3 * static_cast<std::size_t>(d.Hm)),
      grouped_count_(d.rows() * static_cast<std::size_t>(spec.qkv.out)),
      kv_weight_(spec.qkv.weight + static_cast<std::size_t>(d.Hm) * static_cast<std::size_t>(d.H)),
      kv_count_(static_cast<std::size_t>(spec.qkv.out - d.Hm) * static_cast<std::size_t>(d.H)) {
    qkv_ = set.add("qkv", qkv_count_, d.act, Keep::unless_full);
    grouped_ = scratch.add("qkv_grouped", grouped_count_, d.act);
    d_grouped_ = scratch.add("d_qkv_grouped", grouped_count_, d.act);
    d_qkv_ = scratch.add("d_qkv", qkv_count_, d.act);
    if (d.T < d.seq_len)
        positions_ = scratch.add("positions", static_cast<std::size_t>(d.T), kernels::DType::i32);
    if (spec.q_norm != kNoParam)
        qk_norm_ =
            std::make_unique<QkNorm>(spec.q_norm, spec.k_norm, spec.norm_eps, d, set, scratch);
}

const int32_t* GroupedAttention::positions(const PartContext& ctx) const {
    return positions_ < 0 ? nullptr : static_cast<const int32_t*>(ctx.scratch[positions_].data);
}

// Under the document mask each sequence's angles follow its own positions (model/documents.h):
// one sequence a call.
void GroupedAttention::rotary(PartContext& ctx, const Pass& pass, Ptr to, ConstPtr from,
                              bool backward) const {
    const Dims& d = ctx.dims();
    const int hs = d.Hm / d.heads;
    const int32_t* p = document_positions(pass);
    const int calls = p ? d.B : 1, B = p ? 1 : d.B;
    // Rows of the grouped qkv (N, Hm + 2·KVm) and of the attention's (N, 3Hm).
    const std::size_t grouped_row = grouped_count_ / d.rows(), qkv_row = 3 * std::size_t(d.Hm);
    for (int b = 0; b < calls; ++b) {
        const std::size_t row = static_cast<std::size_t>(b) * static_cast<std::size_t>(d.T);
        const int32_t* at = p ? p + row : positions(ctx);
        if (backward)
            ctx.ops.rotary_qkv_backward(to + row * grouped_row, from + row * qkv_row, B, d.T,
                                        d.heads, d.kv_heads, hs, theta_, at);
        else
            ctx.ops.rotary_qkv_forward(to + row * qkv_row, from + row * grouped_row, B, d.T,
                                       d.heads, d.kv_heads, hs, theta_, at);
    }
}

Ptr GroupedAttention::forward(PartContext& ctx, const Pass& pass, ConstPtr x, float drop) const {
    const Ptr grouped = ctx.scratch[grouped_], qkv = pass.buffers[qkv_];
    qkv_linear_->forward(ctx, pass, x, grouped);
    if (qk_norm_) qk_norm_->forward(ctx, pass, grouped);
    rotary(ctx, pass, core_->qkv_target(ctx, qkv), grouped, false);
    core_->forward(ctx, pass, qkv, pass.buffers[out_], drop);
    return proj_->forward(ctx, pass, pass.buffers[out_], Ptr());
}

ConstPtr GroupedAttention::backward(PartContext& ctx, const Pass& pass, ConstPtr x, ConstPtr dy,
                                    float drop, BackwardPart part, bool rebuild) const {
    const ConstPtr d_out = proj_->backward(ctx, pass, pass.buffers[out_], dy, part);
    const Ptr d_qkv = ctx.scratch[d_qkv_], d_grouped = ctx.scratch[d_grouped_];
    ctx.ops.zero(d_qkv, qkv_count_);
    if (rebuild) core_->rebuild(ctx, pass, pass.buffers[qkv_], drop);
    core_->backward(ctx, pass, d_qkv, d_out, pass.buffers[qkv_], pass.buffers[out_], drop);
    ctx.ops.zero(d_grouped, grouped_count_);
    rotary(ctx, pass, d_grouped, d_qkv, true);
    if (qk_norm_) qk_norm_->backward(ctx, pass, d_grouped, part);
    return qkv_linear_->backward(ctx, pass, x, d_grouped, part);
}

void GroupedAttention::backward_weight(PartContext& ctx, const Pass& pass, ConstPtr x) const {
    Attention::backward_weight(ctx, pass, x);
    if (qk_norm_) qk_norm_->backward_weight(ctx, pass);
}

void GroupedAttention::finish_grads(PartContext& ctx) const {
    Attention::finish_grads(ctx);
    if (ctx.kv_replicas.size() > 1 && !ctx.weights.frozen)
        ctx.kv_replicas.all_reduce(ctx.weights.grads.at(kv_weight_), kv_count_);
    if (qk_norm_) qk_norm_->finish_grads(ctx);
}

// ---- the kind (model/part_registry.cpp) -----------------------------------------------------

// Llama's: q_proj, k_proj and v_proj (k's and v's rows by key/value head, each head whole on a
// rank), o_proj; no biases. q's rows and o's columns are the attention's width A = NH·d, H
// unless model.head_dim says otherwise (Qwen3's).
PartDecl grouped_attention_tensors(const GptShape& s) {
    const int64_t H = s.hidden, A = s.attention_width();
    const int64_t KV = int64_t{s.head_size()} * s.kv_heads;  // the key/value heads' width
    const Split rows{SplitKind::column}, heads{SplitKind::column, 1, s.kv_heads};
    const Split columns{SplitKind::row};
    return {{{"q_proj.weight", {A, H}, rows, Init::normal, true},
             {"k_proj.weight", {KV, H}, heads, Init::normal, true},
             {"v_proj.weight", {KV, H}, heads, Init::normal, true},
             {"o_proj.weight", {H, A}, columns, Init::normal, true}},
            {{"q_proj", A, H, rows, LoraTarget::q},
             {"k_proj", KV, H, heads, LoraTarget::k},
             {"v_proj", KV, H, heads, LoraTarget::v},
             {"o_proj", H, A, columns, LoraTarget::o}}};
}

// q, k and v run as one linear (their weights adjacent), (N, Hm + 2·KVm): each adapter adds to
// its block of the output's columns.
GroupedAttentionSpec grouped_attention_spec(const PartBuild& in) {
    const Dims& d = in.d;
    const int KVm = d.kv_heads * (d.Hm / d.heads);  // this rank's key/value width
    GroupedAttentionSpec a;
    a.qkv = in.linear(LinearSplit::column, d.H, d.Hm + 2 * KVm, in.tensor(0), kNoParam);
    in.adapt(a.qkv, LoraTarget::q, 0, d.Hm);
    in.adapt(a.qkv, LoraTarget::k, d.Hm, KVm);
    in.adapt(a.qkv, LoraTarget::v, d.Hm + KVm, KVm);
    a.proj = in.linear(LinearSplit::row, d.Hm, d.H, in.tensor(3), kNoParam);
    in.adapt(a.proj, LoraTarget::o);
    a.head_begin = in.head_begin();
    a.heads_total = in.shape().heads;
    a.rope_theta = in.shape().rope_theta;
    a.make_core = in.options.make_core;
    return a;
}

// Counted as Korthikanti et al. count GPT's (docs/FORMULAS.md), without dropout: the q, k, v
// linear's input 2 whole; Q and the o linear's input 2 each, K and V 2·g/a each, the
// probabilities 2·a·s/h, split. With fewer key/value heads than tensor ranks (g < t) each rank
// keeps one whole head's K and V, as if g were t.
ActivationTerms grouped_attention_activations(const GptShape& s, int tensor) {
    const double g_over_a =
        static_cast<double>(s.kv_heads) * kv_replicas(s.kv_heads, tensor) / s.heads;
    return {2, 4 + 4 * g_over_a, 2};
}

namespace {

std::unique_ptr<Attention> build_grouped_attention(const PartBuild& in) {
    return std::make_unique<GroupedAttention>(grouped_attention_spec(in), in.d,
                                              in.options.attention_saved, in.set, in.scratch);
}

}  // namespace

extern const AttentionKind grouped_attention_kind{"grouped",
                                                  grouped_attention_tensors,
                                                  build_grouped_attention,
                                                  grouped_attention_activations,
                                                  true,
                                                  true,
                                                  false};

}  // namespace trident::model
