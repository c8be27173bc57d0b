// A split linear: forward, backward and the weight gradient (see linear.h).
#include "model/linear.h"

namespace trident::model {

using kernels::ConstPtr;
using kernels::Ptr;

Linear::Linear(const LinearSpec& spec, const Dims& d, SetSpec& set, ScratchSpec& scratch)
    : spec_(spec) {
    const std::size_t N = d.rows(), R = d.rows_mine();
    const std::size_t in = static_cast<std::size_t>(spec.in),
                      out = static_cast<std::size_t>(spec.out);
    const bool column = spec.split == LinearSplit::column;
    const bool sp = d.sequence_parallel;
    if (column && sp) input_all_ = set.add("input_all", N * in, d.act, Keep::unless_full);
    if (spec.stash) stash_ = set.add("d_output", N * out, d.act, Keep::split);
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
    // A row-split linear's input is split by columns: this rank's start at in·rank.
    const int whole_in = column ? spec.in : spec.in * d.tensor_size;
    const int first_column = column ? 0 : spec.in * d.tensor_rank;
    for (const LoraSpec& adapter : spec.lora)
        lora_.emplace_back(adapter, d, spec.in, spec.out, whole_in, first_column, !column, set,
                           scratch);
}

ConstPtr Linear::gemm_input(const Pass& pass, ConstPtr x) const {
    return input_all_ >= 0 ? ConstPtr(pass.buffers[input_all_]) : x;
}

Ptr Linear::forward(PartContext& ctx, const Pass& pass, ConstPtr x, Ptr y) const {
    const Dims& d = ctx.dims();
    const FlatBuffer::Base w = ctx.weights.params.base();
    const ConstPtr bias = spec_.bias == kNoParam ? ConstPtr() : ConstPtr(w + spec_.bias);
    const std::size_t in = static_cast<std::size_t>(spec_.in),
                      out = static_cast<std::size_t>(spec_.out), R = d.rows_mine();
    // Under sequence parallelism: the GEMM on block b of the rows (R of them), see below.
    const auto rows_of = [&](Ptr to, ConstPtr from, const ConstPtr& with_bias) {
        return [&, to, from, with_bias](int b) {
            const std::size_t first = static_cast<std::size_t>(b) * R;
            ctx.ops.matmul_forward(to + first * out, from + first * in, w + spec_.weight, with_bias,
                                   d.R, spec_.in, spec_.out);
        };
    };
    if (spec_.split == LinearSplit::column) {
        // Under sequence parallelism the GEMM runs block by block in the gather.
        const bool pieces = input_all_ >= 0;
        const ConstPtr x_all =
            input_all_ >= 0 ? ctx.rows.all_rows(x, pass.buffers[input_all_], in,
                                                pieces ? rows_of(y, pass.buffers[input_all_], bias)
                                                       : TensorRows::BlockFn())
                            : x;
        if (!pieces)
            ctx.ops.matmul_forward(y, x_all, w + spec_.weight, bias, d.N, spec_.in, spec_.out);
        for (const LoraAdapter& adapter : lora_) {
            adapter.down(ctx, pass, x_all);
            adapter.up(ctx, pass, y);
        }
        return y;
    }
    const Ptr partial = ctx.scratch[partial_];
    // The adapters add into the whole partial output: with them it is made before the ring.
    const bool pieces = d.sequence_parallel && lora_.empty();
    if (!pieces)
        ctx.ops.matmul_forward(partial, x, w + spec_.weight, nullptr, d.N, spec_.in, spec_.out);
    for (const LoraAdapter& adapter : lora_) {
        adapter.down(ctx, pass, x);
        adapter.up(ctx, pass, partial);
    }
    const Ptr mine =
        ctx.rows.reduce_rows(partial, ctx.scratch[reduced_], out, ctx.scratch[ring_sums_],
                             pieces ? rows_of(partial, x, ConstPtr()) : TensorRows::BlockFn());
    if (bias) ctx.ops.add_bias(mine, bias, d.R, spec_.out);
    return mine;
}

ConstPtr Linear::backward(PartContext& ctx, const Pass& pass, ConstPtr x, ConstPtr dy,
                          BackwardPart part) const {
    const Dims& d = ctx.dims();
    const bool column = spec_.split == LinearSplit::column;
    const std::size_t N = d.rows(), R = d.rows_mine();
    const std::size_t in = static_cast<std::size_t>(spec_.in),
                      out = static_cast<std::size_t>(spec_.out);
    const bool weights = part == BackwardPart::both;
    const bool own = weights && !ctx.weights.frozen;
    const ConstPtr x_gemm = gemm_input(pass, x);
    const Ptr dx = ctx.scratch[d_input_];
    ctx.ops.zero(dx, N * in);
    // Under sequence parallelism: the input's gradient of block b of the rows (R of them),
    // from `from` (N, out). The adapters add into the whole of it: with them a column-split
    // linear's is made before the ring.
    const bool pieces = d.sequence_parallel && (!column || lora_.empty());
    const auto rows_of = [&](ConstPtr from) {
        return [&, from](int b) {
            const std::size_t first = static_cast<std::size_t>(b) * R;
            ctx.ops.matmul_backward(dx + first * in, Ptr(), Ptr(), from + first * out,
                                    x_gemm + first * in, ctx.weights.params.at(spec_.weight), d.R,
                                    spec_.in, spec_.out);
        };
    };
    // The output's gradient as the GEMM reads it: all rows (a row-split linear's gathered).
    const ConstPtr dy_all = column ? dy
                                   : ctx.rows.all_rows(dy, ctx.scratch[d_output_all_], out,
                                                       pieces ? rows_of(ctx.scratch[d_output_all_])
                                                              : TensorRows::BlockFn());
    if (part == BackwardPart::input && stash_ >= 0)
        ctx.ops.copy(pass.buffers[stash_], dy_all, N * out);
    // With pieces they compute dx block by block (in the gather, or in the ring below); the
    // weights' gradient is one GEMM over all rows either way.
    ctx.ops.matmul_backward(
        pieces ? Ptr() : dx, own ? ctx.weights.grads.at(spec_.weight) : Ptr(),
        own && spec_.bias != kNoParam ? ctx.weights.grads.at(spec_.bias) : Ptr(), dy_all, x_gemm,
        ctx.weights.params.at(spec_.weight), d.N, spec_.in, spec_.out);
    for (const LoraAdapter& adapter : lora_)
        adapter.backward(ctx, pass, x_gemm, dy_all, dx, true, weights);
    if (!column) return dx;
    return ctx.rows.reduce_rows(dx, ctx.scratch[d_rows_], in, ctx.scratch[ring_sums_],
                                pieces ? rows_of(dy_all) : TensorRows::BlockFn());
}

void Linear::backward_weight(PartContext& ctx, const Pass& pass, ConstPtr x) const {
    weight_gradient(ctx, pass, x, pass.buffers[stash_]);
}

void Linear::weight_gradient(PartContext& ctx, const Pass& pass, ConstPtr x, ConstPtr dy) const {
    const ConstPtr x_gemm = gemm_input(pass, x);
    for (const LoraAdapter& adapter : lora_)
        adapter.backward(ctx, pass, x_gemm, dy, Ptr(), false, true);
    if (ctx.weights.frozen) return;
    // No input gradient: the weight is not read (ZeRO-3 need not have it gathered).
    ctx.ops.matmul_backward(nullptr, ctx.weights.grads.at(spec_.weight),
                            spec_.bias != kNoParam ? ctx.weights.grads.at(spec_.bias) : Ptr(), dy,
                            x_gemm, ConstPtr(nullptr, ctx.weights.params.dtype()), ctx.dims().N,
                            spec_.in, spec_.out);
}

void Linear::finish_grads(PartContext& ctx) const {
    for (const LoraAdapter& adapter : lora_) adapter.finish_grads(ctx);
}

void Linear::adapter_down(PartContext& ctx, const Pass& pass, ConstPtr x) const {
    for (const LoraAdapter& adapter : lora_) adapter.down(ctx, pass, x);
}

}  // namespace trident::model
