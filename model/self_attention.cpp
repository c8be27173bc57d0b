// The attention sublayer (see self_attention.h).
#include "model/self_attention.h"

#include "model/context_attention.h"
#include "model/part_kinds.h"

namespace trident::model {

using kernels::ConstPtr;
using kernels::Ptr;

namespace {

std::unique_ptr<AttentionCore> make_core(int head_begin, int heads_total, const MakeCore& maker,
                                         const Dims& d, const AttentionSavedFn& attention_saved,
                                         SetSpec& set, ScratchSpec& scratch) {
    if (maker) return maker(d, head_begin, heads_total, set);
    if (d.C > 1)
        return std::make_unique<ContextAttention>(d, head_begin, heads_total, attention_saved, set,
                                                  scratch);
    return std::make_unique<LocalAttention>(d, head_begin, heads_total, attention_saved, set);
}

}  // namespace

Attention::Attention(const LinearSpec& qkv, const LinearSpec& proj, int head_begin, int heads_total,
                     const MakeCore& maker, const Dims& d, const AttentionSavedFn& attention_saved,
                     SetSpec& set, ScratchSpec& scratch)
    : qkv_linear_(make_linear(qkv, d, set, scratch)),
      core_(make_core(head_begin, heads_total, maker, d, attention_saved, set, scratch)),
      proj_(make_linear(proj, d, set, scratch)),
      out_(set.add("attention_out", d.rows() * static_cast<std::size_t>(d.Hm), d.act,
                   Keep::unless_full)) {}

void Attention::backward_weight(PartContext& ctx, const Pass& pass, ConstPtr x) const {
    proj_->backward_weight(ctx, pass, pass.buffers[out_]);
    qkv_linear_->backward_weight(ctx, pass, x);
}

void Attention::finish_grads(PartContext& ctx) const {
    qkv_linear_->finish_grads(ctx);
    proj_->finish_grads(ctx);
}

SelfAttention::SelfAttention(const SelfAttentionSpec& spec, const Dims& d,
                             const AttentionSavedFn& attention_saved, SetSpec& set,
                             ScratchSpec& scratch)
    : Attention(spec.qkv, spec.proj, spec.head_begin, spec.heads_total, spec.make_core, d,
                attention_saved, set, scratch),
      qkv_count_(d.rows() * 3 * static_cast<std::size_t>(d.Hm)) {
    qkv_ = set.add("qkv", qkv_count_, d.act, Keep::unless_full);
    d_qkv_ = scratch.add("d_qkv", qkv_count_, d.act);
}

Ptr SelfAttention::forward(PartContext& ctx, const Pass& pass, ConstPtr x, float drop) const {
    const Ptr qkv = pass.buffers[qkv_];
    qkv_linear_->forward(ctx, pass, x, core_->qkv_target(ctx, qkv));
    core_->forward(ctx, pass, qkv, pass.buffers[out_], drop);
    return proj_->forward(ctx, pass, pass.buffers[out_], Ptr());
}

ConstPtr SelfAttention::backward(PartContext& ctx, const Pass& pass, ConstPtr x, ConstPtr dy,
                                 float drop, BackwardPart part, bool rebuild) const {
    const ConstPtr d_out = proj_->backward(ctx, pass, pass.buffers[out_], dy, part);
    const Ptr d_qkv = ctx.scratch[d_qkv_];
    ctx.ops.zero(d_qkv, qkv_count_);
    if (rebuild) core_->rebuild(ctx, pass, pass.buffers[qkv_], drop);
    core_->backward(ctx, pass, d_qkv, d_out, pass.buffers[qkv_], pass.buffers[out_], drop);
    return qkv_linear_->backward(ctx, pass, x, d_qkv, part);
}

// ---- the kind (model/part_registry.cpp) -----------------------------------------------------

namespace {

// GPT-2's: c_attn (q, k and v of every head: three blocks of rows, each split by heads) and the
// projection c_proj, both with biases; c_proj's weight starts scaled for the residual stream.
PartDecl gpt2_attention_tensors(const GptShape& s) {
    const int64_t H = s.hidden;
    const Split qkv{SplitKind::column, 3}, row{SplitKind::row};
    return {
        {{"c_attn.weight", {3 * H, H}, qkv, Init::normal, true},
         {"c_attn.bias", {3 * H}, qkv, Init::zeros},
         {"c_proj.weight", {H, H}, row, Init::residual, true},
         {"c_proj.bias", {H}, {}, Init::zeros}},
        {{"c_attn", 3 * H, H, qkv, LoraTarget::qkv}, {"c_proj", H, H, row, LoraTarget::attn_proj}}};
}

std::unique_ptr<Attention> build_gpt2_attention(const PartBuild& in) {
    const Dims& d = in.d;
    SelfAttentionSpec a;
    a.qkv = in.linear(LinearSplit::column, d.H, 3 * d.Hm, in.tensor(0), in.tensor(1));
    in.adapt(a.qkv, LoraTarget::qkv);
    a.proj = in.linear(LinearSplit::row, d.Hm, d.H, in.tensor(2), in.tensor(3));
    in.adapt(a.proj, LoraTarget::attn_proj);
    a.head_begin = in.head_begin();
    a.heads_total = in.shape().heads;
    a.make_core = in.options.make_core;
    return std::make_unique<SelfAttention>(a, d, in.options.attention_saved, in.set, in.scratch);
}

// Korthikanti et al., §4.1: the qkv linear's input 2 and the output's dropout mask 1 whole; Q
// and K 4, V 2 and the projection's input 2 split; the scores' softmax 2, its dropout mask 1
// and its dropped copy 2.
ActivationTerms gpt2_attention_activations(const GptShape&, int) {
    return {3, 8, 5};
}

}  // namespace

extern const AttentionKind gpt2_attention_kind{
    "gpt2", gpt2_attention_tensors, build_gpt2_attention, gpt2_attention_activations, false, false,
    false};

}  // namespace trident::model
