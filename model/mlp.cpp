// GPT-2's and Llama's MLPs (see mlp.h).
#include "model/mlp.h"

namespace trident::model {

using kernels::ConstPtr;
using kernels::Ptr;

namespace {

// The activation's slot names: the input linear's output, the activation's, and the scratch
// of the former's gradient.
struct SlotNames {
    const char *in_out, *activated, *d_in_out;
};

SlotNames slot_names(MlpActivation a) {
    return a == MlpActivation::gelu ? SlotNames{"fc", "fc_gelu", "d_hidden"}
                                    : SlotNames{"gate_up", "swiglu", "d_gate_up"};
}

}  // namespace

Mlp::Mlp(MlpActivation activation, const LinearSpec& in, const LinearSpec& out, const Dims& d,
         SetSpec& set, ScratchSpec& scratch)
    : activation_(activation),
      in_(in, d, set, scratch),
      out_(out, d, set, scratch),
      rows_(d.N),
      width_(d.Fm),
      in_count_(d.rows() * static_cast<std::size_t>(d.Fm) *
                (activation == MlpActivation::swiglu ? 2 : 1)) {
    const SlotNames names = slot_names(activation);
    in_out_ = set.add(names.in_out, in_count_, d.act, Keep::unless_full);
    activated_ = set.add(names.activated, d.rows() * static_cast<std::size_t>(d.Fm), d.act,
                         Keep::unless_full);
    d_in_out_ = scratch.add(names.d_in_out, in_count_, d.act);
}

Ptr Mlp::forward(PartContext& ctx, const Pass& pass, ConstPtr x, bool to_output) const {
    const Ptr in_out = pass.buffers[in_out_], activated = pass.buffers[activated_];
    in_.forward(ctx, pass, x, in_out);
    if (activation_ == MlpActivation::gelu)
        ctx.ops.gelu_forward(activated, in_out, in_count_);
    else
        ctx.ops.swiglu_forward(activated, in_out, rows_, width_);
    if (!to_output) {  // the backward reads out's input and its adapter's h, not its output
        out_.adapter_down(ctx, pass, activated);
        return Ptr();
    }
    return out_.forward(ctx, pass, activated, Ptr());
}

ConstPtr Mlp::backward(PartContext& ctx, const Pass& pass, ConstPtr x, ConstPtr dy,
                       BackwardPart part) const {
    const ConstPtr d_activated = out_.backward(ctx, pass, pass.buffers[activated_], dy, part);
    const Ptr d_in_out = ctx.scratch[d_in_out_];
    const ConstPtr in_out = pass.buffers[in_out_];
    ctx.ops.zero(d_in_out, in_count_);
    if (activation_ == MlpActivation::gelu)
        ctx.ops.gelu_backward(d_in_out, in_out, d_activated, in_count_);
    else
        ctx.ops.swiglu_backward(d_in_out, in_out, d_activated, rows_, width_);
    return in_.backward(ctx, pass, x, d_in_out, part);
}

void Mlp::backward_weight(PartContext& ctx, const Pass& pass, ConstPtr x) const {
    out_.backward_weight(ctx, pass, pass.buffers[activated_]);
    in_.backward_weight(ctx, pass, x);
}

void Mlp::finish_grads(PartContext& ctx) const {
    in_.finish_grads(ctx);
    out_.finish_grads(ctx);
}

}  // namespace trident::model
