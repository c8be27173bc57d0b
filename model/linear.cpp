// A split linear: forward, backward and the weight gradient (see linear.h).
#include "model/linear.h"

#include "model/lora_linear.h"

namespace trident::model {

using kernels::ConstPtr;
using kernels::Ptr;

Linear::Linear(const LinearSpec& spec, const Dims& d, SetSpec& set, ScratchSpec& scratch)
    : spec_(spec),
      gemm_(spec.gemm ? *spec.gemm : dense_gemm()),
      weights_{spec.weight, spec.bias, spec.in, spec.out} {
    const std::size_t N = d.rows(), R = d.rows_mine();
    const std::size_t in = static_cast<std::size_t>(spec.in),
                      out = static_cast<std::size_t>(spec.out);
    const bool column = spec.split == LinearSplit::column;
    const bool sp = d.sequence_parallel;
    if (column && sp) input_all_ = set.add("input_all", N * in, d.act, Keep::unless_full);
    if (spec.stash) stash_ = WeightGradStash(set, "d_output", N * out, d.act);
    if (column) {
        d_input_ = scratch.add("d_input_all", N * in, d.act);
        d_rows_ = scratch.add("d_rows", R * in, d.act);
        partial_ = reduced_ = d_output_all_ = -1;
    } else {
        partial_ = scratch.add("partial", N * out, d.act);
        reduced_ = scratch.add("reduced", sp ? R * out : 0, d.act);
        d_output_all_ = scratch.add("d_output_all", sp ? N * out : 0, d.act);
        d_input_ = scratch.add("d_input", N * in, d.act);
        d_rows_ = -1;
    }
    ring_sums_ = scratch.add("ring_sums", sp ? 2 * R * (column ? in : out) : 0, d.act);
}

ConstPtr Linear::gemm_input(const Pass& pass, ConstPtr x) const {
    return input_all_ >= 0 ? ConstPtr(pass.buffers[input_all_]) : x;
}

TensorRows::BlockFn Linear::output_blocks(PartContext& ctx, Ptr to, ConstPtr from,
                                          bool bias) const {
    const std::size_t R = ctx.dims().rows_mine();
    return [&ctx, this, to, from, bias, R](int b) {
        const std::size_t first = static_cast<std::size_t>(b) * R;
        gemm_.forward(ctx, weights_, to + first * static_cast<std::size_t>(spec_.out),
                      from + first * static_cast<std::size_t>(spec_.in), ctx.dims().R, bias);
    };
}

TensorRows::BlockFn Linear::input_grad_blocks(PartContext& ctx, Ptr dx, ConstPtr dy,
                                              ConstPtr x) const {
    const std::size_t R = ctx.dims().rows_mine();
    return [&ctx, this, dx, dy, x, R](int b) {
        const std::size_t first = static_cast<std::size_t>(b) * R;
        const std::size_t in = static_cast<std::size_t>(spec_.in);
        gemm_.backward(ctx, weights_, dx + first * in, false,
                       dy + first * static_cast<std::size_t>(spec_.out), x + first * in,
                       ctx.dims().R);
    };
}

Ptr Linear::forward(PartContext& ctx, const Pass& pass, ConstPtr x, Ptr y) const {
    return spec_.split == LinearSplit::column ? column_forward(ctx, pass, x, y)
                                              : row_forward(ctx, pass, x);
}

// Under sequence parallelism the GEMM runs block by block in the input's gather.
Ptr Linear::column_forward(PartContext& ctx, const Pass& pass, ConstPtr x, Ptr y) const {
    const bool sp = input_all_ >= 0;
    const ConstPtr x_all =
        sp ? ctx.rows.all_rows(x, pass.buffers[input_all_], static_cast<std::size_t>(spec_.in),
                               output_blocks(ctx, y, pass.buffers[input_all_], true))
           : x;
    if (!sp) gemm_.forward(ctx, weights_, y, x_all, ctx.dims().N, true);
    add_output(ctx, pass, x_all, y);
    return y;
}

// The partial outputs reduced to this rank's rows, the bias added once after; under sequence
// parallelism the GEMM runs block by block in the reduction's ring, unless something adds into
// the whole partial output first.
Ptr Linear::row_forward(PartContext& ctx, const Pass& pass, ConstPtr x) const {
    const Dims& d = ctx.dims();
    const Ptr partial = ctx.scratch[partial_];
    const bool pieces = d.sequence_parallel && !adds();
    if (!pieces) gemm_.forward(ctx, weights_, partial, x, d.N, false);
    add_output(ctx, pass, x, partial);
    const Ptr mine = ctx.rows.reduce_rows(
        partial, ctx.scratch[reduced_], static_cast<std::size_t>(spec_.out),
        ctx.scratch[ring_sums_],
        pieces ? output_blocks(ctx, partial, x, false) : TensorRows::BlockFn());
    if (spec_.bias != kNoParam)
        ctx.ops.add_bias(mine, ctx.weights.params.at(spec_.bias), d.R, spec_.out);
    return mine;
}

ConstPtr Linear::backward(PartContext& ctx, const Pass& pass, ConstPtr x, ConstPtr dy,
                          BackwardPart part) const {
    const Dims& d = ctx.dims();
    const bool column = spec_.split == LinearSplit::column;
    const std::size_t in = static_cast<std::size_t>(spec_.in),
                      out = static_cast<std::size_t>(spec_.out);
    const bool weights = part == BackwardPart::both;
    const ConstPtr x_gemm = gemm_input(pass, x);
    const Ptr dx = ctx.scratch[d_input_];
    ctx.ops.zero(dx, d.rows() * in);
    // Under sequence parallelism the input's gradient is made block by block (in the output
    // gradient's gather, or in the input gradient's ring), unless something adds into the
    // whole of it before its reduction; the weights' gradient is one GEMM over all rows.
    const bool pieces = d.sequence_parallel && (!column || !adds());
    const ConstPtr dy_all =
        column ? dy
               : ctx.rows.all_rows(
                     dy, ctx.scratch[d_output_all_], out,
                     pieces ? input_grad_blocks(ctx, dx, ctx.scratch[d_output_all_], x_gemm)
                            : TensorRows::BlockFn());
    stash_.keep(ctx, pass, part, dy_all);
    gemm_.backward(ctx, weights_, pieces ? Ptr() : dx, weights && !ctx.weights.frozen, dy_all,
                   x_gemm, d.N);
    add_input_grad(ctx, pass, x_gemm, dy_all, dx, weights);
    if (!column) return dx;
    return ctx.rows.reduce_rows(
        dx, ctx.scratch[d_rows_], in, ctx.scratch[ring_sums_],
        pieces ? input_grad_blocks(ctx, dx, dy_all, x_gemm) : TensorRows::BlockFn());
}

void Linear::backward_weight(PartContext& ctx, const Pass& pass, ConstPtr x) const {
    weight_gradient(ctx, pass, x, stash_.kept(pass));
}

void Linear::weight_gradient(PartContext& ctx, const Pass& pass, ConstPtr x, ConstPtr dy) const {
    const ConstPtr x_gemm = gemm_input(pass, x);
    add_weight_grads(ctx, pass, x_gemm, dy);
    if (ctx.weights.frozen) return;
    // No input gradient: the weight is not read (ZeRO-3 need not have it gathered).
    gemm_.backward(ctx, weights_, Ptr(), true, dy, x_gemm, ctx.dims().N);
}

void Linear::add_output(PartContext&, const Pass&, ConstPtr, Ptr) const {}

void Linear::add_input_grad(PartContext&, const Pass&, ConstPtr, ConstPtr, Ptr, bool) const {}

void Linear::add_weight_grads(PartContext&, const Pass&, ConstPtr, ConstPtr) const {}

std::unique_ptr<Linear> make_linear(const LinearSpec& spec, const Dims& d, SetSpec& set,
                                    ScratchSpec& scratch) {
    if (spec.lora.empty()) return std::make_unique<Linear>(spec, d, set, scratch);
    return std::make_unique<LoraLinear>(spec, d, set, scratch);
}

}  // namespace trident::model
