// The MLP with a squared ReLU (So et al. 2021, "Primer", §4: relu(x)²; the modded-nanogpt
// speedruns' MLP), `model.mlp: relu2`: fc (H -> F) and proj (F -> H) without biases around
// relu(x)². A kind registered in model/part_registry.cpp, its tensors "fc.weight" (column-split)
// and "proj.weight" (row-split) under the layer's MLP, its adapters' targets fc and fc_proj.
// No Hugging Face class holds it: export and import refuse it (model/hf_names.h).
//
// Shapes (this rank): fc's output and relu(x)² (N, Fm) kept for the backward; relu(x) rebuilt
// into the scratch (N, Fm) by the backward.
#include "model/mlp.h"
#include "model/part_kinds.h"

namespace trident::model {

namespace {

using kernels::ConstPtr;
using kernels::Ptr;

// out = relu(x)·relu(x); din += 2·relu(x)·dout.
class Relu2 final : public MlpActivation {
public:
    Relu2(const Dims& d, ScratchSpec& scratch)
        : relu_(scratch.add("relu", d.rows() * static_cast<std::size_t>(d.Fm), d.act)) {}

    int inputs_per_output() const override { return 1; }
    Names names() const override { return {"fc", "fc_relu2", "d_hidden"}; }
    void forward(PartContext& ctx, Ptr out, ConstPtr in, int rows, int width) const override {
        const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(width);
        ctx.ops.relu_forward(out, in, n);
        ctx.ops.multiply(out, out, out, n, 1.0f);
    }
    void backward(PartContext& ctx, Ptr din, ConstPtr in, ConstPtr dout, int rows,
                  int width) const override {
        const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(width);
        const Ptr relu = ctx.scratch[relu_];
        ctx.ops.relu_forward(relu, in, n);
        ctx.ops.multiply(relu, relu, dout, n, 2.0f);
        ctx.ops.residual_forward(din, din, relu, n);
    }

private:
    int relu_;  // scratch: relu(x), then its share of the gradient (N, Fm)
};

PartDecl relu2_mlp_tensors(const GptShape& s) {
    const int64_t H = s.hidden, F = s.ffn;
    const Split rows{SplitKind::column}, columns{SplitKind::row};
    return {{{"fc.weight", {F, H}, rows, Init::normal, true},
             {"proj.weight", {H, F}, columns, Init::residual, true}},
            {{"fc", F, H, rows, LoraTarget::fc}, {"proj", H, F, columns, LoraTarget::fc_proj}}};
}

std::unique_ptr<FeedForward> build_relu2_mlp(const PartBuild& in) {
    const Dims& d = in.d;
    LinearSpec fc = in.linear(LinearSplit::column, d.H, d.Fm, in.tensor(0), kNoParam);
    in.adapt(fc, LoraTarget::fc);
    LinearSpec proj = in.linear(LinearSplit::row, d.Fm, d.H, in.tensor(1), kNoParam);
    in.adapt(proj, LoraTarget::fc_proj);
    return std::make_unique<Mlp>(std::make_unique<Relu2>(d, in.scratch), fc, proj, d, in.set,
                                 in.scratch);
}

}  // namespace

extern const MlpKind relu2_mlp_kind{"relu2", relu2_mlp_tensors, build_relu2_mlp,
                                    one_activation_terms};

}  // namespace trident::model
