// GPT-2's and Llama's MLPs (see mlp.h).
#include "model/mlp.h"

namespace trident::model {

using kernels::ConstPtr;
using kernels::Ptr;

GeluMlp::GeluMlp(const LinearSpec& fc, const LinearSpec& fc_proj, const Dims& d, SetSpec& set,
                 ScratchSpec& scratch)
    : fc_(fc, d, set, scratch),
      fc_proj_(fc_proj, d, set, scratch),
      count_(d.rows() * static_cast<std::size_t>(d.Fm)) {
    hidden_ = set.add("fc", count_, d.act, Keep::unless_full);
    activated_ = set.add("fc_gelu", count_, d.act, Keep::unless_full);
    d_hidden_ = scratch.add("d_hidden", count_, d.act);
}

Ptr GeluMlp::forward(PartContext& ctx, const Pass& pass, ConstPtr x, bool to_output) const {
    const Ptr hidden = pass.buffers[hidden_], activated = pass.buffers[activated_];
    fc_.forward(ctx, pass, x, hidden);
    ctx.ops.gelu_forward(activated, hidden, count_);
    if (!to_output) {  // the backward reads fc_proj's input and its adapter's h, not its output
        fc_proj_.adapter_down(ctx, pass, activated);
        return Ptr();
    }
    return fc_proj_.forward(ctx, pass, activated, Ptr());
}

ConstPtr GeluMlp::backward(PartContext& ctx, const Pass& pass, ConstPtr x, ConstPtr dy,
                           BackwardPart part) const {
    const ConstPtr d_activated = fc_proj_.backward(ctx, pass, pass.buffers[activated_], dy, part);
    const Ptr d_hidden = ctx.scratch[d_hidden_];
    ctx.ops.zero(d_hidden, count_);
    ctx.ops.gelu_backward(d_hidden, pass.buffers[hidden_], d_activated, count_);
    return fc_.backward(ctx, pass, x, d_hidden, part);
}

void GeluMlp::backward_weight(PartContext& ctx, const Pass& pass, ConstPtr x) const {
    fc_proj_.backward_weight(ctx, pass, pass.buffers[activated_]);
    fc_.backward_weight(ctx, pass, x);
}

void GeluMlp::finish_grads(PartContext& ctx) const {
    fc_.finish_grads(ctx);
    fc_proj_.finish_grads(ctx);
}

SwiGluMlp::SwiGluMlp(const LinearSpec& gate_up, const LinearSpec& down, const Dims& d, SetSpec& set,
                     ScratchSpec& scratch)
    : gate_up_(gate_up, d, set, scratch), down_(down, d, set, scratch), rows_(d.N), width_(d.Fm) {
    const std::size_t count = d.rows() * static_cast<std::size_t>(d.Fm);
    gate_up_out_ = set.add("gate_up", 2 * count, d.act, Keep::unless_full);
    activated_ = set.add("swiglu", count, d.act, Keep::unless_full);
    d_gate_up_ = scratch.add("d_gate_up", 2 * count, d.act);
}

Ptr SwiGluMlp::forward(PartContext& ctx, const Pass& pass, ConstPtr x, bool to_output) const {
    const Ptr gate_up = pass.buffers[gate_up_out_], activated = pass.buffers[activated_];
    gate_up_.forward(ctx, pass, x, gate_up);
    ctx.ops.swiglu_forward(activated, gate_up, rows_, width_);
    if (!to_output) {  // the backward reads down's input and its adapter's h, not its output
        down_.adapter_down(ctx, pass, activated);
        return Ptr();
    }
    return down_.forward(ctx, pass, activated, Ptr());
}

ConstPtr SwiGluMlp::backward(PartContext& ctx, const Pass& pass, ConstPtr x, ConstPtr dy,
                             BackwardPart part) const {
    const ConstPtr d_activated = down_.backward(ctx, pass, pass.buffers[activated_], dy, part);
    const Ptr d_gate_up = ctx.scratch[d_gate_up_];
    ctx.ops.zero(d_gate_up, 2 * static_cast<std::size_t>(rows_) * width_);
    ctx.ops.swiglu_backward(d_gate_up, pass.buffers[gate_up_out_], d_activated, rows_, width_);
    return gate_up_.backward(ctx, pass, x, d_gate_up, part);
}

void SwiGluMlp::backward_weight(PartContext& ctx, const Pass& pass, ConstPtr x) const {
    down_.backward_weight(ctx, pass, pass.buffers[activated_]);
    gate_up_.backward_weight(ctx, pass, x);
}

void SwiGluMlp::finish_grads(PartContext& ctx) const {
    gate_up_.finish_grads(ctx);
    down_.finish_grads(ctx);
}

}  // namespace trident::model
