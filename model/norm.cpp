// LayerNorm and RMSNorm on this rank's rows of the residual stream (see norm.h).
#include "model/norm.h"

#include "model/part_kinds.h"

namespace trident::model {

using kernels::ConstPtr;
using kernels::Ptr;

namespace {

// The norm's weight where the input gradient is wanted; a weight gradient alone does not read
// it (ZeRO-3 need not have it gathered for a zero-bubble W).
ConstPtr weight_if(const PartContext& ctx, Ptr dx, std::size_t weight) {
    const FlatBuffer& params = ctx.weights.params;
    return dx ? ConstPtr(params.at(weight)) : ConstPtr(nullptr, params.dtype());
}

}  // namespace

LayerNorm::LayerNorm(std::size_t weight, std::size_t bias, const Dims& d, SetSpec& set)
    : weight_(weight), bias_(bias) {
    const std::size_t R = d.rows_mine(), H = static_cast<std::size_t>(d.H);
    out_ = set.add("norm", R * H, d.act, Keep::unless_full);
    mean_ = set.add("norm_mean", R, kernels::DType::f32, Keep::unless_full);
    rstd_ = set.add("norm_rstd", R, kernels::DType::f32, Keep::unless_full);
    stash_ = WeightGradStash(set, "d_norm", R * H, d.act);
}

ConstPtr LayerNorm::forward(PartContext& ctx, const Pass& pass, ConstPtr x) const {
    const FlatBuffer::Base w = ctx.weights.params.base();
    ctx.ops.layernorm_forward(pass.buffers[out_], pass.buffers[mean_].f32(),
                              pass.buffers[rstd_].f32(), x, w + weight_, w + bias_, ctx.dims().R,
                              ctx.dims().H);
    return pass.buffers[out_];
}

void LayerNorm::backward(PartContext& ctx, const Pass& pass, ConstPtr x, ConstPtr dout, Ptr dx,
                         BackwardPart part) const {
    stash_.keep(ctx, pass, part, dout);
    gradient(ctx, pass, x, dout, dx, part == BackwardPart::both);
}

void LayerNorm::backward_weight(PartContext& ctx, const Pass& pass, ConstPtr x) const {
    gradient(ctx, pass, x, stash_.kept(pass), Ptr(), true);
}

void LayerNorm::gradient(PartContext& ctx, const Pass& pass, ConstPtr x, ConstPtr dout, Ptr dx,
                         bool weights) const {
    const bool own = weights && !ctx.weights.frozen;
    if (!dx && !own) return;
    ctx.ops.layernorm_backward(dx, own ? ctx.weights.grads.at(weight_) : Ptr(),
                               own ? ctx.weights.grads.at(bias_) : Ptr(), dout, x,
                               weight_if(ctx, dx, weight_), pass.buffers[mean_].f32(),
                               pass.buffers[rstd_].f32(), ctx.dims().R, ctx.dims().H);
}

void LayerNorm::finish_grads(PartContext& ctx) const {
    if (!ctx.dims().sequence_parallel || ctx.weights.frozen) return;
    const std::size_t H = static_cast<std::size_t>(ctx.dims().H);
    ctx.rows.group().all_reduce(ctx.weights.grads.at(weight_), H);
    ctx.rows.group().all_reduce(ctx.weights.grads.at(bias_), H);
}

RmsNorm::RmsNorm(std::size_t weight, float eps, const Dims& d, SetSpec& set)
    : weight_(weight), eps_(eps) {
    const std::size_t R = d.rows_mine(), H = static_cast<std::size_t>(d.H);
    out_ = set.add("norm", R * H, d.act, Keep::unless_full);
    rstd_ = set.add("norm_rstd", R, kernels::DType::f32, Keep::unless_full);
    stash_ = WeightGradStash(set, "d_norm", R * H, d.act);
}

ConstPtr RmsNorm::forward(PartContext& ctx, const Pass& pass, ConstPtr x) const {
    ctx.ops.rmsnorm_forward(pass.buffers[out_], pass.buffers[rstd_].f32(), x,
                            ctx.weights.params.at(weight_), ctx.dims().R, ctx.dims().H, eps_);
    return pass.buffers[out_];
}

void RmsNorm::backward(PartContext& ctx, const Pass& pass, ConstPtr x, ConstPtr dout, Ptr dx,
                       BackwardPart part) const {
    stash_.keep(ctx, pass, part, dout);
    gradient(ctx, pass, x, dout, dx, part == BackwardPart::both);
}

void RmsNorm::backward_weight(PartContext& ctx, const Pass& pass, ConstPtr x) const {
    gradient(ctx, pass, x, stash_.kept(pass), Ptr(), true);
}

void RmsNorm::gradient(PartContext& ctx, const Pass& pass, ConstPtr x, ConstPtr dout, Ptr dx,
                       bool weights) const {
    const bool own = weights && !ctx.weights.frozen;
    if (!dx && !own) return;
    ctx.ops.rmsnorm_backward(dx, own ? ctx.weights.grads.at(weight_) : Ptr(), dout, x,
                             weight_if(ctx, dx, weight_), pass.buffers[rstd_].f32(), ctx.dims().R,
                             ctx.dims().H);
}

void RmsNorm::finish_grads(PartContext& ctx) const {
    if (!ctx.dims().sequence_parallel || ctx.weights.frozen) return;
    ctx.rows.group().all_reduce(ctx.weights.grads.at(weight_),
                                static_cast<std::size_t>(ctx.dims().H));
}

// ---- the kinds (model/part_registry.cpp) ---------------------------------------------------

namespace {

PartDecl layer_norm_tensors(const GptShape& s) {
    const int64_t H = s.hidden;
    return {{{"weight", {H}, {}, Init::ones}, {"bias", {H}, {}, Init::zeros}}, {}};
}

std::unique_ptr<Norm> build_layer_norm(const PartBuild& in) {
    return std::make_unique<LayerNorm>(in.tensor(0), in.tensor(1), in.d, in.set);
}

PartDecl rms_norm_tensors(const GptShape& s) {
    return {{{"weight", {s.hidden}, {}, Init::ones}}, {}};
}

std::unique_ptr<Norm> build_rms_norm(const PartBuild& in) {
    return std::make_unique<RmsNorm>(in.tensor(0), in.shape().norm_eps, in.d, in.set);
}

// Either norm's input, kept whole on every tensor rank (Korthikanti et al., §4.1).
ActivationTerms norm_activations(const GptShape&, int) {
    return {2, 0, 0};
}

}  // namespace

// GPT-2's LayerNorm: a gain and a bias, epsilon 1e-5; Llama's RMSNorm: a gain, model.norm_eps.
extern const NormKind layer_norm_kind{"layernorm", layer_norm_tensors, build_layer_norm,
                                      norm_activations, false};
extern const NormKind rms_norm_kind{"rmsnorm", rms_norm_tensors, build_rms_norm, norm_activations,
                                    true};

}  // namespace trident::model
