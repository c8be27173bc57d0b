// Attention over a sequence split over the context-parallel group: ring and Ulysses (see
// context_attention.h).
#include "model/context_attention.h"

#include <string>

#include "kernels/error.h"
#include "model/context_split.h"
#include "model/documents.h"

namespace trident::model {

using kernels::ConstPtr;
using kernels::DType;
using kernels::Ptr;

namespace {

// Tags of the ring's messages: the keys and values, and their gradients.
constexpr int kKeysValues = 0;
constexpr int kGradients = 1;

}  // namespace

ContextAttention::ContextAttention(const Dims& d, int head_begin, int heads_total,
                                   const AttentionSavedFn& attention_saved, SetSpec& set,
                                   ScratchSpec& scratch)
    : ring_(d.ring()),
      B_(d.B),
      seq_len_(d.seq_len),
      T_(d.T),
      S_(d.seq_len / (2 * d.C)),
      Hm_(d.Hm),
      heads_(d.heads),
      head_begin_(head_begin),
      heads_total_(heads_total),
      ranks_(d.C),
      rows_(d.rows()) {
    if (ranks_ < 2 || seq_len_ % (2 * ranks_) != 0)
        throw Error("internal: context parallelism over " + std::to_string(ranks_) +
                    " ranks of a sequence of " + std::to_string(seq_len_) + " tokens");
    const std::size_t Hm = static_cast<std::size_t>(Hm_);
    if (ring_) {
        const std::size_t lse = static_cast<std::size_t>(B_) * heads_ * T_;
        saved_ = set.add("attention_lse", lse, DType::f32, Keep::unless_full);
        for (std::size_t i = 0; i < 2; ++i) {
            kv_[i] = scratch.add("ring_kv" + std::to_string(i), rows_ * 2 * Hm, d.act);
            dkv_[i] = scratch.add("ring_dkv" + std::to_string(i), rows_ * 2 * Hm, DType::f32);
        }
        rows_f32_ = scratch.add("ring_out", rows_ * Hm, DType::f32);
        block_out_ = scratch.add("ring_block_out", rows_ * Hm, DType::f32);
        block_lse_ = scratch.add("ring_block_lse", lse, DType::f32);
        return;
    }
    if (heads_ % ranks_ != 0)
        throw Error("internal: Ulysses over " + std::to_string(ranks_) + " ranks of " +
                    std::to_string(heads_) + " heads");
    const kernels::Ops::AttentionSaved saved =
        attention_saved(B_, ulysses_heads(), seq_len_, d.act);
    saved_ = set.add("attention_saved", saved.count, saved.dtype, Keep::unless_recompute);
    out_heads_ = set.add("attention_out_heads", rows_ * Hm, d.act, Keep::unless_full);
    qkv_tokens_ = scratch.add("ulysses_qkv", rows_ * 3 * Hm, d.act);
    send_ = scratch.add("ulysses_send", rows_ * 3 * Hm, d.act);
    receive_ = scratch.add("ulysses_receive", rows_ * 3 * Hm, d.act);
    dout_heads_ = scratch.add("ulysses_dout", rows_ * Hm, d.act);
}

Ptr ContextAttention::qkv_target(PartContext& ctx, Ptr qkv) const {
    return ring_ ? qkv : ctx.scratch[qkv_tokens_];
}

void ContextAttention::forward(PartContext& ctx, const Pass& pass, Ptr qkv, Ptr out,
                               float drop) const {
    const Ptr saved = pass.buffers[saved_];
    if (ring_) return ring_forward(ctx, pass, out, qkv, saved.f32(), drop);
    // Ulysses: this rank's heads over the whole sequence, as one process would run them.
    const int heads = ulysses_heads();
    const Ptr out_heads = pass.buffers[out_heads_];
    to_heads(ctx, ctx.scratch[qkv_tokens_], qkv, 3);
    // Within the windows' documents under data.documents: mask (model/documents.h).
    ctx.ops.document_attention_forward(out_heads, saved, qkv, document_starts(pass), B_, seq_len_,
                                       Hm_ / ranks_, heads, drop, pass.site(0),
                                       head_begin_ + ctx.context.rank() * heads, heads_total_);
    to_tokens(ctx, out_heads, out, 1);
}

void ContextAttention::rebuild(PartContext& ctx, const Pass& pass, ConstPtr qkv, float drop) const {
    if (ring_) return;  // the log-sum-exp is kept
    ctx.ops.document_attention_rebuild(pass.buffers[saved_], qkv, document_starts(pass), B_,
                                       seq_len_, Hm_ / ranks_, ulysses_heads(), drop);
}

void ContextAttention::backward(PartContext& ctx, const Pass& pass, Ptr dqkv, ConstPtr dout,
                                ConstPtr qkv, ConstPtr out, float drop) const {
    const ConstPtr saved = pass.buffers[saved_];
    if (ring_) return ring_backward(ctx, pass, dqkv, dout, qkv, out, saved.f32(), drop);
    const int heads = ulysses_heads();
    const std::size_t Hm = static_cast<std::size_t>(Hm_);
    const Ptr dout_heads = ctx.scratch[dout_heads_];
    to_heads(ctx, dout, dout_heads, 1);
    const Ptr dqkv_heads = ctx.scratch[qkv_tokens_];  // free once the forward is done
    ctx.ops.zero(dqkv_heads, rows_ * 3 * Hm);
    ctx.ops.document_attention_backward(dqkv_heads, dout_heads, qkv, pass.buffers[out_heads_],
                                        saved, document_starts(pass), B_, seq_len_, Hm_ / ranks_,
                                        heads, drop, pass.site(0),
                                        head_begin_ + ctx.context.rank() * heads, heads_total_);
    to_tokens(ctx, dqkv_heads, dqkv, 3);
}

// ---- ring --------------------------------------------------------------------------------------

bool ContextAttention::visible(const PartContext& ctx, int source, int qa, int kb) const {
    return context_chunk(source, kb, ranks_) <= context_chunk(ctx.context.rank(), qa, ranks_);
}

kernels::AttentionBlock ContextAttention::block(const PartContext& ctx, const Pass& pass,
                                                int source, int qa, int kb, float drop) const {
    kernels::AttentionBlock b;
    b.B = B_;
    b.channels = Hm_;
    b.NH = heads_;
    b.q_rows = b.kv_rows = T_;
    b.q_begin = qa * S_;
    b.k_begin = kb * S_;
    b.q_count = b.k_count = S_;
    b.q_position = context_chunk(ctx.context.rank(), qa, ranks_) * S_;
    b.k_position = context_chunk(source, kb, ranks_) * S_;
    b.seq_len = seq_len_;
    b.drop_prob = drop;
    b.seed = pass.site(0);
    b.q_starts = document_starts_held(pass);
    b.head_begin = head_begin_;
    b.heads_total = heads_total_;
    return b;
}

void ContextAttention::ring_exchange(PartContext& ctx, ConstPtr send, Ptr receive,
                                     std::size_t count, int tag) const {
    const int rank = ctx.context.rank();
    const int next = (rank + 1) % ranks_, previous = (rank + ranks_ - 1) % ranks_;
    parallel::Request sent = ctx.context.isend(send, count, next, tag);
    ctx.context.recv(receive, count, previous, tag);
    sent.wait();
}

void ContextAttention::ring_forward(PartContext& ctx, const Pass& pass, Ptr out, ConstPtr qkv,
                                    float* lse, float drop) const {
    kernels::Ops& ops = ctx.ops;
    const int rank = ctx.context.rank();
    const std::size_t Hm = static_cast<std::size_t>(Hm_), kv_count = rows_ * 2 * Hm;
    float* acc = ctx.scratch[rows_f32_].f32();
    float* block_out = ctx.scratch[block_out_].f32();
    float* block_lse = ctx.scratch[block_lse_].f32();
    int held = 0;
    ops.copy_2d(ctx.scratch[kv_[0]], 2 * Hm, qkv + Hm, 3 * Hm, rows_, 2 * Hm);  // own k, v
    for (int step = 0; step < ranks_; ++step) {
        // Step s holds the keys and values of rank (r − s) mod C; the next ones arrive from
        // the previous rank while this one's are used (a non-blocking send).
        const int source = (rank - step + ranks_) % ranks_;
        const ConstPtr kv = ctx.scratch[kv_[static_cast<std::size_t>(held)]];
        parallel::Request sent;
        if (step + 1 < ranks_)
            sent = ctx.context.isend(kv, kv_count, (rank + 1) % ranks_, kKeysValues);
        for (int qa = 0; qa < 2; ++qa)
            // Key half 1 before 0: at step 0 the diagonal block (qa, qa) comes first for both
            // query halves (half 0 sees nothing of this rank's half 1), and writes the running
            // result that later blocks merge into.
            for (int kb = 1; kb >= 0; --kb) {
                if (!visible(ctx, source, qa, kb)) continue;
                const kernels::AttentionBlock b = block(ctx, pass, source, qa, kb, drop);
                if (step == 0 && kb == qa) {
                    ops.attention_block_forward(acc, lse, qkv, kv, b);
                    continue;
                }
                ops.attention_block_forward(block_out, block_lse, qkv, kv, b);
                ops.attention_merge(acc, lse, block_out, block_lse, B_, T_, Hm_, heads_, b.q_begin,
                                    b.q_count);
            }
        if (step + 1 < ranks_) {
            ctx.context.recv(ctx.scratch[kv_[static_cast<std::size_t>(1 - held)]], kv_count,
                             (rank + ranks_ - 1) % ranks_, kKeysValues);
            sent.wait();
            held = 1 - held;
        }
    }
    ops.convert(out, ctx.scratch[rows_f32_], rows_ * Hm);
}

void ContextAttention::ring_backward(PartContext& ctx, const Pass& pass, Ptr dqkv, ConstPtr dout,
                                     ConstPtr qkv, ConstPtr out, const float* lse,
                                     float drop) const {
    kernels::Ops& ops = ctx.ops;
    const int rank = ctx.context.rank();
    const std::size_t Hm = static_cast<std::size_t>(Hm_), kv_count = rows_ * 2 * Hm;
    const Ptr dq_rows = ctx.scratch[rows_f32_];
    ops.zero(dq_rows, rows_ * Hm);
    int held = 0, grads = 0;
    ops.copy_2d(ctx.scratch[kv_[0]], 2 * Hm, qkv + Hm, 3 * Hm, rows_, 2 * Hm);
    ops.zero(ctx.scratch[dkv_[0]], kv_count);
    for (int step = 0; step < ranks_; ++step) {
        // As forward; dkv_[grads] gathers the gradient of the keys and values held, and goes
        // on with them to the next rank, which adds its part: after C hops (the last one
        // after the last step) each rank has its own.
        const int source = (rank - step + ranks_) % ranks_;
        const ConstPtr kv = ctx.scratch[kv_[static_cast<std::size_t>(held)]];
        float* dkv = ctx.scratch[dkv_[static_cast<std::size_t>(grads)]].f32();
        for (int qa = 0; qa < 2; ++qa)
            for (int kb = 0; kb < 2; ++kb)
                if (visible(ctx, source, qa, kb))
                    ops.attention_block_backward(dq_rows.f32(), dkv, dout, qkv, kv, out, lse,
                                                 block(ctx, pass, source, qa, kb, drop));
        if (step + 1 < ranks_) {
            ring_exchange(ctx, kv, ctx.scratch[kv_[static_cast<std::size_t>(1 - held)]], kv_count,
                          kKeysValues);
            held = 1 - held;
        }
        ring_exchange(ctx, ctx.scratch[dkv_[static_cast<std::size_t>(grads)]],
                      ctx.scratch[dkv_[static_cast<std::size_t>(1 - grads)]], kv_count, kGradients);
        grads = 1 - grads;
    }
    ops.copy_2d(dqkv, 3 * Hm, dq_rows, Hm, rows_, Hm);
    ops.copy_2d(dqkv + Hm, 3 * Hm, ctx.scratch[dkv_[static_cast<std::size_t>(grads)]], 2 * Hm,
                rows_, 2 * Hm);
}

// ---- Ulysses ---------------------------------------------------------------------------------

// The exchange's block for rank q holds, for each of this rank's tokens, the `parts` slices of
// q's heads: (B, T, parts, Hm/C). Received from rank q: q's tokens (its two chunks) of this
// rank's heads, put in their places of the sequence.
void ContextAttention::to_heads(PartContext& ctx, ConstPtr local, Ptr heads, int parts) const {
    kernels::Ops& ops = ctx.ops;
    const Ptr send = ctx.scratch[send_], receive = ctx.scratch[receive_];
    const std::size_t Hm = static_cast<std::size_t>(Hm_);
    const std::size_t Hh = Hm / static_cast<std::size_t>(ranks_);
    const std::size_t P = static_cast<std::size_t>(parts), width = P * Hh;  // a head-split row
    const std::size_t block = rows_ * width, S = static_cast<std::size_t>(S_);
    const std::size_t L = static_cast<std::size_t>(seq_len_), T = static_cast<std::size_t>(T_);
    for (int q = 0; q < ranks_; ++q)
        for (std::size_t p = 0; p < P; ++p)
            ops.copy_2d(send + q * block + p * Hh, width, local + p * Hm + q * Hh, P * Hm, rows_,
                        Hh);
    ctx.context.all_to_all(send, receive, block);
    for (int q = 0; q < ranks_; ++q)
        for (int half = 0; half < 2; ++half) {
            const std::size_t chunk = static_cast<std::size_t>(context_chunk(q, half, ranks_));
            ops.copy_2d(heads + chunk * S * width, L * width,
                        receive + q * block + static_cast<std::size_t>(half) * S * width, T * width,
                        static_cast<std::size_t>(B_), S * width);
        }
}

void ContextAttention::to_tokens(PartContext& ctx, ConstPtr heads, Ptr local, int parts) const {
    kernels::Ops& ops = ctx.ops;
    const Ptr send = ctx.scratch[send_], receive = ctx.scratch[receive_];
    const std::size_t Hm = static_cast<std::size_t>(Hm_);
    const std::size_t Hh = Hm / static_cast<std::size_t>(ranks_);
    const std::size_t P = static_cast<std::size_t>(parts), width = P * Hh;
    const std::size_t block = rows_ * width, S = static_cast<std::size_t>(S_);
    const std::size_t L = static_cast<std::size_t>(seq_len_), T = static_cast<std::size_t>(T_);
    for (int q = 0; q < ranks_; ++q)
        for (int half = 0; half < 2; ++half) {
            const std::size_t chunk = static_cast<std::size_t>(context_chunk(q, half, ranks_));
            ops.copy_2d(send + q * block + static_cast<std::size_t>(half) * S * width, T * width,
                        heads + chunk * S * width, L * width, static_cast<std::size_t>(B_),
                        S * width);
        }
    ctx.context.all_to_all(send, receive, block);
    for (int q = 0; q < ranks_; ++q)
        for (std::size_t p = 0; p < P; ++p)
            ops.copy_2d(local + p * Hm + q * Hh, P * Hm, receive + q * block + p * Hh, width, rows_,
                        Hh);
}

}  // namespace trident::model
