// Qwen3's query and key norms (see qk_norm.h).
#include "model/qk_norm.h"

#include <string>

namespace trident::model {

using kernels::ConstPtr;
using kernels::Ptr;

QkNorm::QkNorm(std::size_t q_weight, std::size_t k_weight, float eps, const Dims& d, SetSpec& set,
               ScratchSpec& scratch)
    : eps_(eps),
      rows_(d.rows()),
      row_(static_cast<std::size_t>(d.Hm) +
           2 * static_cast<std::size_t>(d.kv_heads) * static_cast<std::size_t>(d.Hm / d.heads)),
      hs_(d.Hm / d.heads) {
    const std::size_t hs = static_cast<std::size_t>(hs_);
    const auto block = [&](Block& b, std::size_t weight, std::size_t column, int heads,
                           const char* name) {
        b.weight = weight;
        b.column = column;
        b.heads = heads;
        b.width = static_cast<std::size_t>(heads) * hs;
        const std::string n = name;
        b.input = set.add(n + "_input", rows_ * b.width, d.act, Keep::unless_full);
        b.rstd = set.add(n + "_rstd", rows_ * static_cast<std::size_t>(heads), kernels::DType::f32,
                         Keep::unless_full);
        b.stash = WeightGradStash(set, "d_" + n, rows_ * b.width, d.act);
    };
    block(q_, q_weight, 0, d.heads, "q_norm");
    block(k_, k_weight, q_.width, d.kv_heads, "k_norm");
    dy_ = scratch.add("d_qk_norm_out", rows_ * q_.width, d.act);
    dx_ = scratch.add("d_qk_norm_in", rows_ * q_.width, d.act);
}

void QkNorm::forward(PartContext& ctx, const Pass& pass, Ptr g) const {
    for (const Block* b : {&q_, &k_}) {
        const Ptr in = pass.buffers[b->input];
        ctx.ops.copy_2d(in, b->width, g + b->column, row_, rows_, b->width);
        // The normalized rows (N·heads, hs) straight back into g's columns: through the
        // gradient scratch, free in the forward.
        const Ptr out = ctx.scratch[dx_];
        ctx.ops.rmsnorm_forward(out, pass.buffers[b->rstd].f32(), in,
                                ctx.weights.params.at(b->weight),
                                static_cast<int>(rows_) * b->heads, hs_, eps_);
        ctx.ops.copy_2d(g + b->column, row_, out, b->width, rows_, b->width);
    }
}

void QkNorm::backward(PartContext& ctx, const Pass& pass, Ptr dg, BackwardPart part) const {
    for (const Block* b : {&q_, &k_}) {
        const Ptr dy = ctx.scratch[dy_], dx = ctx.scratch[dx_];
        ctx.ops.copy_2d(dy, b->width, dg + b->column, row_, rows_, b->width);
        b->stash.keep(ctx, pass, part, dy);
        ctx.ops.zero(dx, rows_ * b->width);
        const bool own = part == BackwardPart::both && !ctx.weights.frozen;
        ctx.ops.rmsnorm_backward(dx, own ? ctx.weights.grads.at(b->weight) : Ptr(), dy,
                                 pass.buffers[b->input], ctx.weights.params.at(b->weight),
                                 pass.buffers[b->rstd].f32(), static_cast<int>(rows_) * b->heads,
                                 hs_);
        ctx.ops.copy_2d(dg + b->column, row_, dx, b->width, rows_, b->width);
    }
}

void QkNorm::backward_weight(PartContext& ctx, const Pass& pass) const {
    if (ctx.weights.frozen) return;
    // The weights' gradients alone do not read them (ZeRO-3 need not have them gathered).
    const ConstPtr unread(nullptr, ctx.weights.params.dtype());
    for (const Block* b : {&q_, &k_})
        ctx.ops.rmsnorm_backward(Ptr(), ctx.weights.grads.at(b->weight), b->stash.kept(pass),
                                 pass.buffers[b->input], unread, pass.buffers[b->rstd].f32(),
                                 static_cast<int>(rows_) * b->heads, hs_);
}

void QkNorm::finish_grads(PartContext& ctx) const {
    if (ctx.weights.frozen || ctx.dims().M == 1) return;
    for (const Block* b : {&q_, &k_})
        ctx.rows.group().all_reduce(ctx.weights.grads.at(b->weight), static_cast<std::size_t>(hs_));
}

}  // namespace trident::model
