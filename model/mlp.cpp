// The MLP, and GPT-2's and Llama's kinds of it (see mlp.h).
#include "model/mlp.h"

#include "model/part_kinds.h"

namespace trident::model {

using kernels::ConstPtr;
using kernels::Ptr;

namespace {

// GELU, tanh form (GPT-2's).
class Gelu final : public MlpActivation {
public:
    int inputs_per_output() const override { return 1; }
    Names names() const override { return {"fc", "fc_gelu", "d_hidden"}; }
    void forward(PartContext& ctx, Ptr out, ConstPtr in, int rows, int width) const override {
        ctx.ops.gelu_forward(out, in, static_cast<std::size_t>(rows) * width);
    }
    void backward(PartContext& ctx, Ptr din, ConstPtr in, ConstPtr dout, int rows,
                  int width) const override {
        ctx.ops.gelu_backward(din, in, dout, static_cast<std::size_t>(rows) * width);
    }
};

// SwiGLU (Llama's): silu(gate)·up, each row's gate then up.
class Swiglu final : public MlpActivation {
public:
    int inputs_per_output() const override { return 2; }
    Names names() const override { return {"gate_up", "swiglu", "d_gate_up"}; }
    void forward(PartContext& ctx, Ptr out, ConstPtr in, int rows, int width) const override {
        ctx.ops.swiglu_forward(out, in, rows, width);
    }
    void backward(PartContext& ctx, Ptr din, ConstPtr in, ConstPtr dout, int rows,
                  int width) const override {
        ctx.ops.swiglu_backward(din, in, dout, rows, width);
    }
};

}  // namespace

std::unique_ptr<MlpActivation> swiglu_activation() {
    return std::make_unique<Swiglu>();
}

Mlp::Mlp(std::unique_ptr<MlpActivation> activation, const LinearSpec& in, const LinearSpec& out,
         const Dims& d, SetSpec& set, ScratchSpec& scratch)
    : activation_(std::move(activation)),
      in_(make_linear(in, d, set, scratch)),
      out_(make_linear(out, d, set, scratch)),
      rows_(d.N),
      width_(d.Fm),
      in_count_(d.rows() * static_cast<std::size_t>(d.Fm) *
                static_cast<std::size_t>(activation_->inputs_per_output())) {
    const MlpActivation::Names names = activation_->names();
    in_out_ = set.add(names.in_out, in_count_, d.act, Keep::unless_full);
    activated_ = set.add(names.activated, d.rows() * static_cast<std::size_t>(d.Fm), d.act,
                         Keep::unless_full);
    d_in_out_ = scratch.add(names.d_in_out, in_count_, d.act);
}

Ptr Mlp::forward(PartContext& ctx, const Pass& pass, ConstPtr x, bool to_output) const {
    const Ptr in_out = pass.buffers[in_out_], activated = pass.buffers[activated_];
    in_->forward(ctx, pass, x, in_out);
    activation_->forward(ctx, activated, in_out, rows_, width_);
    if (!to_output) {  // the backward reads out's input and what it rebuilds from it
        out_->rebuild(ctx, pass, activated);
        return Ptr();
    }
    return out_->forward(ctx, pass, activated, Ptr());
}

ConstPtr Mlp::backward(PartContext& ctx, const Pass& pass, ConstPtr x, ConstPtr dy,
                       BackwardPart part) const {
    const ConstPtr d_activated = out_->backward(ctx, pass, pass.buffers[activated_], dy, part);
    const Ptr d_in_out = ctx.scratch[d_in_out_];
    const ConstPtr in_out = pass.buffers[in_out_];
    ctx.ops.zero(d_in_out, in_count_);
    activation_->backward(ctx, d_in_out, in_out, d_activated, rows_, width_);
    return in_->backward(ctx, pass, x, d_in_out, part);
}

void Mlp::backward_weight(PartContext& ctx, const Pass& pass, ConstPtr x) const {
    out_->backward_weight(ctx, pass, pass.buffers[activated_]);
    in_->backward_weight(ctx, pass, x);
}

void Mlp::finish_grads(PartContext& ctx) const {
    in_->finish_grads(ctx);
    out_->finish_grads(ctx);
}

// ---- the kinds (model/part_registry.cpp) ---------------------------------------------------

namespace {

// GPT-2's: c_fc (H -> F) and c_proj (F -> H) with biases, c_proj's weight scaled for the
// residual stream.
PartDecl gelu_mlp_tensors(const GptShape& s) {
    const int64_t H = s.hidden, F = s.ffn;
    const Split rows{SplitKind::column}, columns{SplitKind::row};
    return {{{"c_fc.weight", {F, H}, rows, Init::normal, true},
             {"c_fc.bias", {F}, rows, Init::zeros},
             {"c_proj.weight", {H, F}, columns, Init::residual, true},
             {"c_proj.bias", {H}, {}, Init::zeros}},
            {{"c_fc", F, H, rows, LoraTarget::fc}, {"c_proj", H, F, columns, LoraTarget::fc_proj}}};
}

std::unique_ptr<FeedForward> build_gelu_mlp(const PartBuild& in) {
    const Dims& d = in.d;
    LinearSpec fc = in.linear(LinearSplit::column, d.H, d.Fm, in.tensor(0), in.tensor(1));
    in.adapt(fc, LoraTarget::fc);
    LinearSpec proj = in.linear(LinearSplit::row, d.Fm, d.H, in.tensor(2), in.tensor(3));
    in.adapt(proj, LoraTarget::fc_proj);
    return std::make_unique<Mlp>(std::make_unique<Gelu>(), fc, proj, d, in.set, in.scratch);
}

// Llama's: gate_proj and up_proj (H -> F each), down_proj (F -> H); no biases.
PartDecl swiglu_mlp_tensors(const GptShape& s) {
    const int64_t H = s.hidden, F = s.ffn;
    const Split rows{SplitKind::column}, columns{SplitKind::row};
    return {{{"gate_proj.weight", {F, H}, rows, Init::normal, true},
             {"up_proj.weight", {F, H}, rows, Init::normal, true},
             {"down_proj.weight", {H, F}, columns, Init::normal, true}},
            {{"gate_proj", F, H, rows, LoraTarget::gate},
             {"up_proj", F, H, rows, LoraTarget::up},
             {"down_proj", H, F, columns, LoraTarget::down}}};
}

// gate and up run as one linear (their weights adjacent), (N, 2Fm): each adapter adds to its
// block of the output's columns.
std::unique_ptr<FeedForward> build_swiglu_mlp(const PartBuild& in) {
    const Dims& d = in.d;
    LinearSpec gate_up = in.linear(LinearSplit::column, d.H, 2 * d.Fm, in.tensor(0), kNoParam);
    in.adapt(gate_up, LoraTarget::gate, 0, d.Fm);
    in.adapt(gate_up, LoraTarget::up, d.Fm, d.Fm);
    LinearSpec down = in.linear(LinearSplit::row, d.Fm, d.H, in.tensor(2), kNoParam);
    in.adapt(down, LoraTarget::down);
    return std::make_unique<Mlp>(swiglu_activation(), gate_up, down, d, in.set, in.scratch);
}

// Counted the same way (docs/FORMULAS.md), without dropout: the gate and up linear's input 2
// whole; gate, up and their product 2·F/H each, split.
ActivationTerms swiglu_mlp_activations(const GptShape& s, int) {
    return {2, 6.0 * s.ffn / s.hidden, 0};
}

}  // namespace

extern const MlpKind gelu_mlp_kind{"gelu", gelu_mlp_tensors, build_gelu_mlp, one_activation_terms};
extern const MlpKind swiglu_mlp_kind{"swiglu", swiglu_mlp_tensors, build_swiglu_mlp,
                                     swiglu_mlp_activations};

ActivationTerms one_activation_terms(const GptShape& s, int) {
    return {3, 4.0 * s.ffn / s.hidden, 0};
}

}  // namespace trident::model
