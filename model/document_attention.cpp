// Attention within documents (see document_attention.h).
#include "model/document_attention.h"

#include "kernels/error.h"
#include "model/documents.h"

namespace trident::model {

using kernels::ConstPtr;
using kernels::Ptr;

namespace {

const int32_t* starts_of(const Pass& pass) {
    if (!pass.documents || !pass.documents->starts())
        throw Error("internal: attention within documents without the microbatch's documents");
    return pass.documents->starts();
}

}  // namespace

DocumentAttention::DocumentAttention(const Dims& d, int head_begin, int heads_total,
                                     const AttentionSavedFn& attention_saved, SetSpec& set)
    : head_begin_(head_begin), heads_total_(heads_total) {
    const kernels::Ops::AttentionSaved saved = attention_saved(d.B, d.heads, d.T, d.act);
    saved_ = set.add("attention_saved", saved.count, saved.dtype, Keep::unless_recompute);
}

void DocumentAttention::forward(PartContext& ctx, const Pass& pass, Ptr qkv, Ptr out,
                                float drop) const {
    const Dims& d = ctx.dims();
    ctx.ops.document_attention_forward(out, pass.buffers[saved_], qkv, starts_of(pass), d.B, d.T,
                                       d.Hm, d.heads, drop, pass.site(0), head_begin_,
                                       heads_total_);
}

void DocumentAttention::rebuild(PartContext& ctx, const Pass& pass, ConstPtr qkv,
                                float drop) const {
    const Dims& d = ctx.dims();
    ctx.ops.document_attention_rebuild(pass.buffers[saved_], qkv, starts_of(pass), d.B, d.T, d.Hm,
                                       d.heads, drop);
}

void DocumentAttention::backward(PartContext& ctx, const Pass& pass, Ptr dqkv, ConstPtr dout,
                                 ConstPtr qkv, ConstPtr out, float drop) const {
    const Dims& d = ctx.dims();
    ctx.ops.document_attention_backward(dqkv, dout, qkv, out, pass.buffers[saved_], starts_of(pass),
                                        d.B, d.T, d.Hm, d.heads, drop, pass.site(0), head_begin_,
                                        heads_total_);
}

MakeCore document_core(const AttentionSavedFn& attention_saved) {
    return [attention_saved](const Dims& d, int head_begin, int heads_total, SetSpec& set) {
        return std::unique_ptr<AttentionCore>(
            std::make_unique<DocumentAttention>(d, head_begin, heads_total, attention_saved, set));
    };
}

}  // namespace trident::model
