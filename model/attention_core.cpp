// Attention over the whole sequence on this rank (see attention_core.h).
#include "model/attention_core.h"

#include "model/documents.h"

namespace trident::model {

using kernels::ConstPtr;
using kernels::Ptr;

LocalAttention::LocalAttention(const Dims& d, int head_begin, int heads_total,
                               const AttentionSavedFn& attention_saved, SetSpec& set)
    : head_begin_(head_begin), heads_total_(heads_total) {
    const kernels::Ops::AttentionSaved saved = attention_saved(d.B, d.heads, d.T, d.act);
    saved_ = set.add("attention_saved", saved.count, saved.dtype, Keep::unless_recompute);
}

void LocalAttention::forward(PartContext& ctx, const Pass& pass, Ptr qkv, Ptr out,
                             float drop) const {
    const Dims& d = ctx.dims();
    ctx.ops.document_attention_forward(out, pass.buffers[saved_], qkv, document_starts(pass), d.B,
                                       d.T, d.Hm, d.heads, drop, pass.site(0), head_begin_,
                                       heads_total_);
}

void LocalAttention::rebuild(PartContext& ctx, const Pass& pass, ConstPtr qkv, float drop) const {
    const Dims& d = ctx.dims();
    ctx.ops.document_attention_rebuild(pass.buffers[saved_], qkv, document_starts(pass), d.B, d.T,
                                       d.Hm, d.heads, drop);
}

void LocalAttention::backward(PartContext& ctx, const Pass& pass, Ptr dqkv, ConstPtr dout,
                              ConstPtr qkv, ConstPtr out, float drop) const {
    const Dims& d = ctx.dims();
    ctx.ops.document_attention_backward(dqkv, dout, qkv, out, pass.buffers[saved_],
                                        document_starts(pass), d.B, d.T, d.Hm, d.heads, drop,
                                        pass.site(0), head_begin_, heads_total_);
}

}  // namespace trident::model
