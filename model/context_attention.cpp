// Attention over a sequence split over the context-parallel group: ring and Ulysses (see
// context_attention.h).
#include "model/context_attention.h"

#include "error.h"
#include "model/context_split.h"

namespace trident::model {

using kernels::ConstPtr;
using kernels::DType;
using kernels::Ptr;

namespace {

// Tags of the ring's messages: the keys and values, and their gradients.
constexpr int kKeysValues = 0;
constexpr int kGradients = 1;

}  // namespace

ContextAttention::ContextAttention(kernels::Ops& ops, parallel::Comm& group, ContextMode mode,
                                   const ContextShape& shape, DType activations)
    : ops_(ops),
      group_(group),
      mode_(mode),
      s_(shape),
      ranks_(group.size()),
      rank_(group.rank()),
      T_local_(shape.T / group.size()),
      S_(shape.T / (2 * group.size())),
      rows_(static_cast<std::size_t>(shape.B) * (shape.T / group.size())),
      act_(activations),
      saved_{0, DType::f32} {
    if (ranks_ < 2 || shape.T % (2 * ranks_) != 0)
        throw Error("internal: context parallelism over " + std::to_string(ranks_) +
                    " ranks of a sequence of " + std::to_string(shape.T) + " tokens");
    const std::size_t C = static_cast<std::size_t>(s_.C);
    if (mode_ == ContextMode::ring) {
        saved_ = {static_cast<std::size_t>(s_.B) * s_.NH * T_local_, DType::f32};
        for (int i = 0; i < 2; ++i) {
            kv_[static_cast<std::size_t>(i)] = DeviceBuffer(ops, rows_ * 2 * C, act_);
            dkv_[static_cast<std::size_t>(i)] = DeviceBuffer(ops, rows_ * 2 * C);
        }
        rows_f32_ = DeviceBuffer(ops, rows_ * C);
        block_out_ = DeviceBuffer(ops, rows_ * C);
        block_lse_ = DeviceBuffer(ops, saved_.count);
        return;
    }
    if (s_.NH % ranks_ != 0)
        throw Error("internal: Ulysses over " + std::to_string(ranks_) + " ranks of " +
                    std::to_string(s_.NH) + " heads");
    saved_ = ops.attention_saved(s_.B, s_.NH / ranks_, s_.T, act_);
    qkv_tokens_ = DeviceBuffer(ops, rows_ * 3 * C, act_);
    send_ = DeviceBuffer(ops, rows_ * 3 * C, act_);
    receive_ = DeviceBuffer(ops, rows_ * 3 * C, act_);
    dout_heads_ = DeviceBuffer(ops, rows_ * C, act_);
}

Ptr ContextAttention::qkv_input(Ptr kept_qkv) const {
    return mode_ == ContextMode::ring ? kept_qkv : qkv_tokens_.data();
}

void ContextAttention::forward(Ptr out, Ptr qkv, Ptr out_heads, Ptr saved, float drop_prob,
                               uint64_t seed) {
    if (mode_ == ContextMode::ring) return ring_forward(out, qkv, saved.f32(), drop_prob, seed);
    // Ulysses: this rank's heads over the whole sequence, as one process would run them.
    const int heads = s_.NH / ranks_;
    to_heads(qkv_tokens_.data(), qkv, 3);
    ops_.attention_forward(out_heads, saved, qkv, s_.B, s_.T, s_.C / ranks_, heads, drop_prob, seed,
                           s_.head_begin + rank_ * heads, s_.heads_total);
    to_tokens(out_heads, out, 1);
}

void ContextAttention::rebuild(Ptr saved, ConstPtr qkv, float drop_prob) {
    if (mode_ == ContextMode::ring) return;
    ops_.attention_rebuild(saved, qkv, s_.B, s_.T, s_.C / ranks_, s_.NH / ranks_, drop_prob);
}

void ContextAttention::backward(Ptr dqkv, ConstPtr dout, ConstPtr qkv, ConstPtr out,
                                ConstPtr out_heads, ConstPtr saved, float drop_prob,
                                uint64_t seed) {
    if (mode_ == ContextMode::ring)
        return ring_backward(dqkv, dout, qkv, out, saved.f32(), drop_prob, seed);
    const int heads = s_.NH / ranks_;
    const std::size_t C = static_cast<std::size_t>(s_.C);
    to_heads(dout, dout_heads_.data(), 1);
    const Ptr dqkv_heads = qkv_tokens_.data();  // free once the forward is done
    ops_.zero(dqkv_heads, rows_ * 3 * C);
    ops_.attention_backward(dqkv_heads, dout_heads_.data(), qkv, out_heads, saved, s_.B, s_.T,
                            s_.C / ranks_, heads, drop_prob, seed, s_.head_begin + rank_ * heads,
                            s_.heads_total);
    to_tokens(dqkv_heads, dqkv, 3);
}

// ---- ring --------------------------------------------------------------------------------------

bool ContextAttention::visible(int source, int qa, int kb) const {
    return context_chunk(source, kb, ranks_) <= context_chunk(rank_, qa, ranks_);
}

kernels::AttentionBlock ContextAttention::block(int source, int qa, int kb, float drop_prob,
                                                uint64_t seed) const {
    kernels::AttentionBlock b;
    b.B = s_.B;
    b.C = s_.C;
    b.NH = s_.NH;
    b.q_rows = b.kv_rows = T_local_;
    b.q_begin = qa * S_;
    b.k_begin = kb * S_;
    b.q_count = b.k_count = S_;
    b.q_position = context_chunk(rank_, qa, ranks_) * S_;
    b.k_position = context_chunk(source, kb, ranks_) * S_;
    b.seq_len = s_.T;
    b.drop_prob = drop_prob;
    b.seed = seed;
    b.head_begin = s_.head_begin;
    b.heads_total = s_.heads_total;
    return b;
}

void ContextAttention::ring_exchange(ConstPtr send, Ptr receive, std::size_t count, int tag) {
    const int next = (rank_ + 1) % ranks_, previous = (rank_ + ranks_ - 1) % ranks_;
    parallel::Request sent = group_.isend(send, count, next, tag);
    group_.recv(receive, count, previous, tag);
    sent.wait();
}

void ContextAttention::ring_forward(Ptr out, ConstPtr qkv, float* lse, float drop_prob,
                                    uint64_t seed) {
    const std::size_t C = static_cast<std::size_t>(s_.C), kv_count = rows_ * 2 * C;
    float* acc = rows_f32_.f32();
    int held = 0;
    ops_.copy_2d(kv_[0].data(), 2 * C, qkv + C, 3 * C, rows_, 2 * C);  // this rank's k, v
    for (int step = 0; step < ranks_; ++step) {
        // Step s holds the keys and values of rank (r − s) mod C; the next ones arrive from
        // the previous rank while this one's are used (a non-blocking send).
        const int source = (rank_ - step + ranks_) % ranks_;
        const ConstPtr kv = kv_[static_cast<std::size_t>(held)].data();
        parallel::Request sent;
        if (step + 1 < ranks_) sent = group_.isend(kv, kv_count, (rank_ + 1) % ranks_, kKeysValues);
        for (int qa = 0; qa < 2; ++qa)
            // Key half 1 before 0: at step 0 the diagonal block (qa, qa) comes first for both
            // query halves (half 0 sees nothing of this rank's half 1), and writes the running
            // result that later blocks merge into.
            for (int kb = 1; kb >= 0; --kb) {
                if (!visible(source, qa, kb)) continue;
                const kernels::AttentionBlock b = block(source, qa, kb, drop_prob, seed);
                if (step == 0 && kb == qa) {
                    ops_.attention_block_forward(acc, lse, qkv, kv, b);
                    continue;
                }
                ops_.attention_block_forward(block_out_.f32(), block_lse_.f32(), qkv, kv, b);
                ops_.attention_merge(acc, lse, block_out_.f32(), block_lse_.f32(), s_.B, T_local_,
                                     s_.C, s_.NH, b.q_begin, b.q_count);
            }
        if (step + 1 < ranks_) {
            group_.recv(kv_[static_cast<std::size_t>(1 - held)].data(), kv_count,
                        (rank_ + ranks_ - 1) % ranks_, kKeysValues);
            sent.wait();
            held = 1 - held;
        }
    }
    ops_.convert(out, rows_f32_.data(), rows_ * C);
}

void ContextAttention::ring_backward(Ptr dqkv, ConstPtr dout, ConstPtr qkv, ConstPtr out,
                                     const float* lse, float drop_prob, uint64_t seed) {
    const std::size_t C = static_cast<std::size_t>(s_.C), kv_count = rows_ * 2 * C;
    float* dq = rows_f32_.f32();
    ops_.zero(rows_f32_.data(), rows_ * C);
    int held = 0, grads = 0;
    ops_.copy_2d(kv_[0].data(), 2 * C, qkv + C, 3 * C, rows_, 2 * C);
    ops_.zero(dkv_[0].data(), kv_count);
    for (int step = 0; step < ranks_; ++step) {
        // As forward; dkv_[grads] gathers the gradient of the keys and values held, and goes
        // on with them to the next rank, which adds its part: after C hops (the last one
        // after the last step) each rank has its own.
        const int source = (rank_ - step + ranks_) % ranks_;
        const ConstPtr kv = kv_[static_cast<std::size_t>(held)].data();
        float* dkv = dkv_[static_cast<std::size_t>(grads)].f32();
        for (int qa = 0; qa < 2; ++qa)
            for (int kb = 0; kb < 2; ++kb)
                if (visible(source, qa, kb))
                    ops_.attention_block_backward(dq, dkv, dout, qkv, kv, out, lse,
                                                  block(source, qa, kb, drop_prob, seed));
        if (step + 1 < ranks_) {
            ring_exchange(kv, kv_[static_cast<std::size_t>(1 - held)].data(), kv_count,
                          kKeysValues);
            held = 1 - held;
        }
        ring_exchange(dkv_[static_cast<std::size_t>(grads)].data(),
                      dkv_[static_cast<std::size_t>(1 - grads)].data(), kv_count, kGradients);
        grads = 1 - grads;
    }
    ops_.copy_2d(dqkv, 3 * C, rows_f32_.data(), C, rows_, C);
    ops_.copy_2d(dqkv + C, 3 * C, dkv_[static_cast<std::size_t>(grads)].data(), 2 * C, rows_,
                 2 * C);
}

// ---- Ulysses ---------------------------------------------------------------------------------

// The exchange's block for rank q holds, for each of this rank's tokens, the `parts` slices of
// q's heads: (B, T_l, parts, Cm/C). Received from rank q: q's tokens (its two chunks) of this
// rank's heads, put in their places of the sequence.
void ContextAttention::to_heads(ConstPtr local, Ptr heads, int parts) {
    const std::size_t C = static_cast<std::size_t>(s_.C), Ch = C / static_cast<std::size_t>(ranks_);
    const std::size_t P = static_cast<std::size_t>(parts), width = P * Ch;  // of a head-split row
    const std::size_t block = rows_ * width, S = static_cast<std::size_t>(S_);
    const std::size_t T = static_cast<std::size_t>(s_.T), T_l = static_cast<std::size_t>(T_local_);
    for (int q = 0; q < ranks_; ++q)
        for (std::size_t p = 0; p < P; ++p)
            ops_.copy_2d(send_.data() + q * block + p * Ch, width, local + p * C + q * Ch, P * C,
                         rows_, Ch);
    group_.all_to_all(send_.data(), receive_.data(), block);
    for (int q = 0; q < ranks_; ++q)
        for (int half = 0; half < 2; ++half) {
            const std::size_t chunk = static_cast<std::size_t>(context_chunk(q, half, ranks_));
            ops_.copy_2d(heads + chunk * S * width, T * width,
                         receive_.data() + q * block + static_cast<std::size_t>(half) * S * width,
                         T_l * width, static_cast<std::size_t>(s_.B), S * width);
        }
}

void ContextAttention::to_tokens(ConstPtr heads, Ptr local, int parts) {
    const std::size_t C = static_cast<std::size_t>(s_.C), Ch = C / static_cast<std::size_t>(ranks_);
    const std::size_t P = static_cast<std::size_t>(parts), width = P * Ch;
    const std::size_t block = rows_ * width, S = static_cast<std::size_t>(S_);
    const std::size_t T = static_cast<std::size_t>(s_.T), T_l = static_cast<std::size_t>(T_local_);
    for (int q = 0; q < ranks_; ++q)
        for (int half = 0; half < 2; ++half) {
            const std::size_t chunk = static_cast<std::size_t>(context_chunk(q, half, ranks_));
            ops_.copy_2d(send_.data() + q * block + static_cast<std::size_t>(half) * S * width,
                         T_l * width, heads + chunk * S * width, T * width,
                         static_cast<std::size_t>(s_.B), S * width);
        }
    group_.all_to_all(send_.data(), receive_.data(), block);
    for (int q = 0; q < ranks_; ++q)
        for (std::size_t p = 0; p < P; ++p)
            ops_.copy_2d(local + p * C + q * Ch, P * C, receive_.data() + q * block + p * Ch, width,
                         rows_, Ch);
}

}  // namespace trident::model
