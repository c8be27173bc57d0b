// A transformer layer from its parts (see transformer_layer.h).
#include "model/transformer_layer.h"

#include <utility>

namespace trident::model {

using kernels::ConstPtr;
using kernels::Ptr;

namespace {

// The dropout sites of a layer's residual branches (Pass::site).
constexpr int kAttentionBranch = 1;
constexpr int kFeedForwardBranch = 2;

}  // namespace

TransformerLayer::TransformerLayer(SetSpec spec, Parts parts, float dropout, const Dims& d,
                                   ScratchSpec& scratch)
    : spec_(std::move(spec)), parts_(std::move(parts)), dropout_(dropout) {
    const std::size_t RH = d.rows_mine() * static_cast<std::size_t>(d.H);
    residual2_ = spec_.add("residual2", RH, d.act, Keep::unless_full);
    output_ = spec_.add("output", RH, d.act, Keep::always);
    d_rows_ = scratch.add("d_rows", RH, d.act);
}

void TransformerLayer::forward(PartContext& ctx, const Pass& pass, ConstPtr x, Ptr output) const {
    const std::size_t RH = ctx.dims().rows_mine() * static_cast<std::size_t>(ctx.dims().H);
    const float drop = pass.drop(dropout_);
    const Ptr x2 = pass.buffers[residual2_];
    const ConstPtr h1 = parts_.norm1->forward(ctx, pass, x);
    const Ptr a = parts_.attention->forward(ctx, pass, h1, drop);
    ctx.rows.dropout(a, drop, pass.site(kAttentionBranch));
    ctx.ops.residual_forward(x2, x, a, RH);
    const ConstPtr h2 = parts_.norm2->forward(ctx, pass, x2);
    const Ptr f = parts_.feed_forward->forward(ctx, pass, h2, static_cast<bool>(output));
    if (!output) return;
    ctx.rows.dropout(f, drop, pass.site(kFeedForwardBranch));
    ctx.ops.residual_forward(output, x2, f, RH);
}

void TransformerLayer::backward(PartContext& ctx, const Pass& pass, ConstPtr x, Ptr d_residual,
                                BackwardPart part, bool rebuild, bool defer_attention) const {
    const float drop = pass.drop(dropout_);
    const Ptr d_rows = ctx.scratch[d_rows_];
    const ConstPtr x2 = pass.buffers[residual2_];
    // The feed-forward branch, then the attention branch, each adding into d_residual.
    ConstPtr d = ctx.rows.through_dropout(d_residual, d_rows, drop, pass.site(kFeedForwardBranch));
    ConstPtr dx = parts_.feed_forward->backward(ctx, pass, parts_.norm2->output(pass), d, part);
    parts_.norm2->backward(ctx, pass, x2, dx, d_residual, part);
    d = ctx.rows.through_dropout(d_residual, d_rows, drop, pass.site(kAttentionBranch));
    dx = parts_.attention->backward(ctx, pass, parts_.norm1->output(pass), d, drop,
                                    defer_attention ? BackwardPart::input : part, rebuild);
    parts_.norm1->backward(ctx, pass, x, dx, d_residual, part);
}

void TransformerLayer::backward_weight(PartContext& ctx, const Pass& pass, ConstPtr x) const {
    parts_.feed_forward->backward_weight(ctx, pass, parts_.norm2->output(pass));
    parts_.norm2->backward_weight(ctx, pass, pass.buffers[residual2_]);
    parts_.attention->backward_weight(ctx, pass, parts_.norm1->output(pass));
    parts_.norm1->backward_weight(ctx, pass, x);
}

void TransformerLayer::attention_weights(PartContext& ctx, const Pass& pass) const {
    parts_.attention->backward_weight(ctx, pass, parts_.norm1->output(pass));
}

void TransformerLayer::finish_grads(PartContext& ctx) const {
    parts_.norm1->finish_grads(ctx);
    parts_.norm2->finish_grads(ctx);
    parts_.attention->finish_grads(ctx);
    parts_.feed_forward->finish_grads(ctx);
}

}  // namespace trident::model
