// The vocab-parallel embedding (see embedding.h).
#include "model/embedding.h"

#include "model/documents.h"

namespace trident::model {

using kernels::ConstPtr;
using kernels::DType;
using kernels::Ptr;

Embedding::Embedding(const EmbeddingSpec& spec, const Dims& d, SetSpec& set, ScratchSpec& scratch)
    : spec_(spec) {
    const std::size_t N = d.rows(), R = d.rows_mine(), H = static_cast<std::size_t>(d.H);
    tokens_ = set.add("tokens", N, DType::i32, Keep::always);
    partial_ = set.add("embedding_partial", d.sequence_parallel ? N * H : 0, d.act, Keep::always);
    stash_ = WeightGradStash(set, "d_embedding", R * H, d.act);
    if (d.T < d.seq_len)
        positions_ = scratch.add("positions", static_cast<std::size_t>(d.T), DType::i32);
    d_rows_ = scratch.add("d_rows", R * H, d.act);
    d_output_all_ = scratch.add("d_output_all", d.sequence_parallel ? N * H : 0, d.act);
    ring_sums_ = scratch.add("ring_sums", d.sequence_parallel ? 2 * R * H : 0, d.act);
}

const int32_t* Embedding::positions(const PartContext& ctx) const {
    return positions_ < 0 ? nullptr : static_cast<const int32_t*>(ctx.scratch[positions_].data);
}

void Embedding::forward(PartContext& ctx, const Pass& pass, const int32_t* tokens, Ptr out) const {
    const Dims& d = ctx.dims();
    const FlatBuffer::Base w = ctx.weights.params.base();
    const Ptr ids = pass.buffers[tokens_];
    ctx.ops.upload(ids.data, tokens, d.rows() * sizeof(int32_t));
    const Ptr embedded = d.sequence_parallel ? pass.buffers[partial_] : out;
    const bool adds_positions = ctx.rows.group().rank() == 0 && spec_.wpe != kNoParam;
    const ConstPtr wpe = adds_positions ? ConstPtr(w + spec_.wpe) : ConstPtr();
    const auto* id_rows = static_cast<const int32_t*>(ids.data);
    if (const int32_t* p = document_positions(pass)) {
        // Each sequence's positions are its own (model/documents.h): one sequence a call.
        for (std::size_t b = 0; b < static_cast<std::size_t>(d.B); ++b) {
            const std::size_t row = b * static_cast<std::size_t>(d.T);
            ctx.ops.embedding_forward(embedded + row * d.H, id_rows + row, w + spec_.wte, wpe, 1,
                                      d.T, d.H, spec_.vocab_begin, d.Vm, p + row, d.seq_len);
        }
    } else {
        ctx.ops.embedding_forward(embedded, id_rows, w + spec_.wte, wpe, d.B, d.T, d.H,
                                  spec_.vocab_begin, d.Vm, positions(ctx), d.seq_len);
    }
    const Ptr encoded =
        ctx.rows.reduce_rows(embedded, out, static_cast<std::size_t>(d.H), ctx.scratch[ring_sums_]);
    ctx.rows.dropout(encoded, pass.drop(spec_.dropout), pass.site(0));
}

void Embedding::backward(PartContext& ctx, const Pass& pass, ConstPtr d_out,
                         BackwardPart part) const {
    if (ctx.weights.frozen) return;  // no gradient to compute, and no input to pass one on to
    if (part == BackwardPart::input) return stash_.keep(ctx, pass, part, d_out);
    gradient(ctx, pass, d_out);
}

void Embedding::backward_weight(PartContext& ctx, const Pass& pass) const {
    if (ctx.weights.frozen) return;
    gradient(ctx, pass, stash_.kept(pass));
}

void Embedding::gradient(PartContext& ctx, const Pass& pass, ConstPtr d_out) const {
    const Dims& d = ctx.dims();
    // The reduction's backward: every rank scatters all rows into its slice.
    const ConstPtr d_encoded =
        ctx.rows.all_rows(ctx.rows.through_dropout(d_out, ctx.scratch[d_rows_],
                                                   pass.drop(spec_.dropout), pass.site(0)),
                          ctx.scratch[d_output_all_], static_cast<std::size_t>(d.H));
    const Ptr d_wpe = spec_.wpe == kNoParam ? Ptr() : ctx.weights.grads.at(spec_.wpe);
    const Ptr d_wte = ctx.weights.grads.at(spec_.wte);
    const auto* id_rows = static_cast<const int32_t*>(pass.buffers[tokens_].data);
    if (const int32_t* p = document_positions(pass)) {
        for (std::size_t b = 0; b < static_cast<std::size_t>(d.B); ++b) {
            const std::size_t row = b * static_cast<std::size_t>(d.T);
            ctx.ops.embedding_backward(d_wte, d_wpe, d_encoded + row * d.H, id_rows + row, 1, d.T,
                                       d.H, spec_.vocab_begin, d.Vm, p + row, d.seq_len);
        }
        return;
    }
    ctx.ops.embedding_backward(d_wte, d_wpe, d_encoded, id_rows, d.B, d.T, d.H, spec_.vocab_begin,
                               d.Vm, positions(ctx), d.seq_len);
}

}  // namespace trident::model
