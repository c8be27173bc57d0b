// A split linear's low-rank adapter: forward, backward, gradient reduction (see lora_adapter.h).
#include "model/lora_adapter.h"

namespace trident::model {

using kernels::ConstPtr;
using kernels::Ptr;

LoraAdapter::LoraAdapter(const LoraSpec& spec, const Dims& d, int in, int out, int whole_in,
                         int column, bool row_split, SetSpec& set, ScratchSpec& scratch)
    : spec_(spec),
      in_(in),
      out_(out),
      whole_in_(whole_in),
      column_(column),
      width_(spec.width > 0 ? spec.width : out),
      row_split_(row_split) {
    const std::size_t N = d.rows(), r = static_cast<std::size_t>(spec.rank);
    const std::size_t width = static_cast<std::size_t>(width_);
    h_ = set.add("lora_h", N * r, d.act, Keep::unless_full);
    x_ = scratch.add("lora_x", N * static_cast<std::size_t>(in), d.act);
    y_ = scratch.add("lora_y", N * width, d.act);
    g_ = scratch.add("lora_g", N * r, d.act);
    block_ = whole_output() ? -1 : scratch.add("lora_block", N * width, d.act);
}

uint64_t LoraAdapter::seed(const Pass& pass) const {
    return kernels::hash64(pass.site(3), static_cast<uint64_t>(spec_.target));
}

ConstPtr LoraAdapter::dropped(PartContext& ctx, const Pass& pass, ConstPtr x) const {
    const float p = drop(pass);
    if (p == 0) return x;
    const Ptr out = ctx.scratch[x_];
    const uint64_t s = seed(pass);
    ctx.rows.for_each_run(static_cast<std::size_t>(in_), static_cast<std::size_t>(whole_in_),
                          static_cast<std::size_t>(column_),
                          [&](std::size_t local, std::size_t whole, std::size_t count) {
                              ctx.ops.dropout_forward(out + local, x + local, count, p, s, whole);
                          });
    return out;
}

void LoraAdapter::down(PartContext& ctx, const Pass& pass, ConstPtr x) const {
    const int N = ctx.dims().N;
    const Ptr h = pass.buffers[h_];
    ctx.ops.matmul_forward(h, dropped(ctx, pass, x), ctx.weights.lora_params.at(spec_.a), nullptr,
                           N, in_, spec_.rank);
    ctx.ops.scale(h, static_cast<std::size_t>(N) * static_cast<std::size_t>(spec_.rank),
                  spec_.scale);
}

void LoraAdapter::up(PartContext& ctx, const Pass& pass, Ptr y) const {
    const int N = ctx.dims().N;
    const std::size_t rows = static_cast<std::size_t>(N), width = static_cast<std::size_t>(width_);
    const Ptr hb = ctx.scratch[y_];
    ctx.ops.matmul_forward(hb, pass.buffers[h_], ctx.weights.lora_params.at(spec_.b), nullptr, N,
                           spec_.rank, width_);
    if (whole_output()) {
        ctx.ops.residual_forward(y, y, hb, rows * width);
        return;
    }
    // The block's columns of y, out of place: y[:, first ..] += h·Bᵀ.
    const std::size_t stride = static_cast<std::size_t>(out_);
    const Ptr block = ctx.scratch[block_], at = y + static_cast<std::size_t>(spec_.first);
    ctx.ops.copy_2d(block, width, at, stride, rows, width);
    ctx.ops.residual_forward(block, block, hb, rows * width);
    ctx.ops.copy_2d(at, stride, block, width, rows, width);
}

void LoraAdapter::backward(PartContext& ctx, const Pass& pass, ConstPtr x, ConstPtr dy, Ptr dx,
                           bool inputs, bool weights) const {
    kernels::Ops& ops = ctx.ops;
    const int N = ctx.dims().N, r = spec_.rank;
    const std::size_t Nr = static_cast<std::size_t>(N) * static_cast<std::size_t>(r);
    const ConstPtr A = ctx.weights.lora_params.at(spec_.a);
    const ConstPtr B = ctx.weights.lora_params.at(spec_.b);
    if (!whole_output()) {  // the block's columns of dy (N, width)
        const Ptr block = ctx.scratch[block_];
        const std::size_t width = static_cast<std::size_t>(width_);
        ops.copy_2d(block, width, dy + static_cast<std::size_t>(spec_.first),
                    static_cast<std::size_t>(out_), static_cast<std::size_t>(N), width);
        dy = block;
    }
    // g = s·dy·B, the gradient of drop(x)·Aᵀ (N, r); dB += dyᵀ·h.
    const Ptr g = ctx.scratch[g_];
    ops.zero(g, Nr);
    ops.matmul_backward(g, weights ? ctx.weights.lora_grads.at(spec_.b) : Ptr(), nullptr, dy,
                        pass.buffers[h_], B, N, r, width_);
    ops.scale(g, Nr, spec_.scale);
    // dA += gᵀ·drop(x).
    if (weights)
        ops.matmul_backward(nullptr, ctx.weights.lora_grads.at(spec_.a), nullptr, g,
                            dropped(ctx, pass, x), A, N, in_, r);
    if (!inputs) return;
    // dx += g·A, through the dropout's mask.
    const float p = drop(pass);
    if (p == 0) {
        ops.matmul_backward(dx, nullptr, nullptr, g, x, A, N, in_, r);
        return;
    }
    const Ptr undropped = ctx.scratch[x_];
    ops.zero(undropped, static_cast<std::size_t>(N) * static_cast<std::size_t>(in_));
    ops.matmul_backward(undropped, nullptr, nullptr, g, x, A, N, in_, r);
    const uint64_t s = seed(pass);
    ctx.rows.for_each_run(static_cast<std::size_t>(in_), static_cast<std::size_t>(whole_in_),
                          static_cast<std::size_t>(column_),
                          [&](std::size_t local, std::size_t whole, std::size_t count) {
                              ops.dropout_backward(dx + local, undropped + local, count, p, s,
                                                   whole);
                          });
}

void LoraAdapter::finish_grads(PartContext& ctx) const {
    parallel::Comm& tensor = ctx.rows.group();
    if (tensor.size() == 1) return;
    // The whole factor: each tensor rank added its part of the sum.
    const std::size_t r = static_cast<std::size_t>(spec_.rank);
    if (row_split_)
        tensor.all_reduce(ctx.weights.lora_grads.at(spec_.b), static_cast<std::size_t>(width_) * r);
    else
        tensor.all_reduce(ctx.weights.lora_grads.at(spec_.a), static_cast<std::size_t>(in_) * r);
}

}  // namespace trident::model
