// The final norm, the LM head and the vocab-parallel loss (see lm_head.h).
#include "model/lm_head.h"

#include <utility>

#include "model/documents.h"

namespace trident::model {

using kernels::ConstPtr;
using kernels::DType;
using kernels::Ptr;

namespace {

LinearSpec head_linear(const LmHeadSpec& spec, const Dims& d) {
    LinearSpec s;
    s.split = LinearSplit::column;
    s.in = d.H;
    s.out = d.Vm;
    s.weight = spec.weight;
    s.stash = false;  // the logits' buffer keeps their gradient
    return s;
}

// Rows (of `width` elements) of the uncounted positions zeroed: their losses, or their logits'
// gradients (data.mask_eod_loss, model/documents.h).
void drop_uncounted(PartContext& ctx, const Pass& pass, Ptr rows, std::size_t width) {
    if (!pass.documents) return;
    for (const int32_t n : pass.documents->uncounted())
        ctx.ops.zero(rows + static_cast<std::size_t>(n) * width, width);
}

}  // namespace

LmHead::LmHead(const LmHeadSpec& spec, std::unique_ptr<Norm> norm, const Dims& d, SetSpec& set,
               ScratchSpec& scratch)
    : spec_(spec), norm_(std::move(norm)), linear_(head_linear(spec, d), d, set, scratch) {
    const std::size_t N = d.rows();
    logits_ = set.add("logits", N * static_cast<std::size_t>(d.Vm), d.act, Keep::always);
    stats_ = set.add("loss_stats", 4 * N, DType::f32, Keep::always);
    lse_ = set.add("loss_lse", N, DType::f32, Keep::always);
    losses_ = set.add("losses", N, DType::f32, Keep::always);
    targets_ = set.add("targets", N, DType::i32, Keep::always);
}

void LmHead::forward(PartContext& ctx, const Pass& pass, ConstPtr x) const {
    const ConstPtr normed = norm_->forward(ctx, pass, x);
    linear_.forward(ctx, pass, normed, pass.buffers[logits_]);
}

void LmHead::loss(PartContext& ctx, const Pass& pass, const int32_t* targets,
                  double* loss_sum) const {
    const Dims& d = ctx.dims();
    const int N = d.N;
    const Ptr ids = pass.buffers[targets_];
    ctx.ops.upload(ids.data, targets, d.rows() * sizeof(int32_t));
    const int32_t* target_ids = static_cast<const int32_t*>(ids.data);
    // loss_stats = row max | global max | sum of exps | target logit, each (N); the last two
    // are reduced in one call.
    float* row_max = pass.buffers[stats_].f32();
    float* global_max = row_max + N;
    float* sums = global_max + N;
    float* target_logit = sums + N;
    ctx.ops.cross_entropy_partials(row_max, sums, target_logit, pass.buffers[logits_], target_ids,
                                   N, spec_.vocab_begin, spec_.vocab, d.Vm);
    ctx.ops.copy(global_max, row_max, d.rows());
    ctx.rows.group().all_reduce(global_max, d.rows(), parallel::ReduceOp::max);
    ctx.ops.cross_entropy_rescale(sums, row_max, global_max, N);
    ctx.rows.group().all_reduce(sums, 2 * d.rows());
    const Ptr losses = pass.buffers[losses_];
    ctx.ops.cross_entropy_losses(losses.f32(), pass.buffers[lse_].f32(), global_max, sums,
                                 target_logit, N);
    drop_uncounted(ctx, pass, losses, 1);
    ctx.ops.add_mean(loss_sum, losses.f32(), N);
}

void LmHead::backward(PartContext& ctx, const Pass& pass, ConstPtr x, float dloss, Ptr d_x,
                      BackwardPart part) const {
    const Dims& d = ctx.dims();
    const Ptr logits = pass.buffers[logits_];
    ctx.ops.cross_entropy_backward(logits, logits, pass.buffers[lse_].f32(),
                                   static_cast<const int32_t*>(pass.buffers[targets_].data), dloss,
                                   d.N, spec_.vocab_begin, spec_.vocab, d.Vm);
    drop_uncounted(ctx, pass, logits, static_cast<std::size_t>(d.Vm));
    // This rank's vocabulary share of the head input's gradient, summed over the group.
    const ConstPtr d_normed = linear_.backward(ctx, pass, norm_->output(pass), logits, part);
    ctx.ops.zero(d_x, d.rows_mine() * static_cast<std::size_t>(d.H));
    norm_->backward(ctx, pass, x, d_normed, d_x, part);
}

void LmHead::backward_weight(PartContext& ctx, const Pass& pass, ConstPtr x) const {
    linear_.weight_gradient(ctx, pass, norm_->output(pass), pass.buffers[logits_]);
    norm_->backward_weight(ctx, pass, x);
}

}  // namespace trident::model
