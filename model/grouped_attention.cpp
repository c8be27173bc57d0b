// Llama's attention sublayer (see grouped_attention.h).
#include "model/grouped_attention.h"

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
}

const int32_t* GroupedAttention::positions(const PartContext& ctx) const {
    return positions_ < 0 ? nullptr : static_cast<const int32_t*>(ctx.scratch[positions_].data);
}

Ptr GroupedAttention::forward(PartContext& ctx, const Pass& pass, ConstPtr x, float drop) const {
    const Dims& d = ctx.dims();
    const Ptr grouped = ctx.scratch[grouped_], qkv = pass.buffers[qkv_];
    qkv_linear_.forward(ctx, pass, x, grouped);
    ctx.ops.rotary_qkv_forward(core_->qkv_target(ctx, qkv), grouped, d.B, d.T, d.heads, d.kv_heads,
                               d.Hm / d.heads, theta_, positions(ctx));
    core_->forward(ctx, pass, qkv, pass.buffers[out_], drop);
    return proj_.forward(ctx, pass, pass.buffers[out_], Ptr());
}

ConstPtr GroupedAttention::backward(PartContext& ctx, const Pass& pass, ConstPtr x, ConstPtr dy,
                                    float drop, BackwardPart part, bool rebuild) const {
    const Dims& d = ctx.dims();
    const ConstPtr d_out = proj_.backward(ctx, pass, pass.buffers[out_], dy, part);
    const Ptr d_qkv = ctx.scratch[d_qkv_], d_grouped = ctx.scratch[d_grouped_];
    ctx.ops.zero(d_qkv, qkv_count_);
    if (rebuild) core_->rebuild(ctx, pass, pass.buffers[qkv_], drop);
    core_->backward(ctx, pass, d_qkv, d_out, pass.buffers[qkv_], pass.buffers[out_], drop);
    ctx.ops.zero(d_grouped, grouped_count_);
    ctx.ops.rotary_qkv_backward(d_grouped, d_qkv, d.B, d.T, d.heads, d.kv_heads, d.Hm / d.heads,
                                theta_, positions(ctx));
    return qkv_linear_.backward(ctx, pass, x, d_grouped, part);
}

void GroupedAttention::finish_grads(PartContext& ctx) const {
    Attention::finish_grads(ctx);
    if (ctx.kv_replicas.size() > 1 && !ctx.weights.frozen)
        ctx.kv_replicas.all_reduce(ctx.weights.grads.at(kv_weight_), kv_count_);
}

}  // namespace trident::model
