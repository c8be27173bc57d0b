// Causal attention over a sequence split over the C ranks of a context-parallel group
// (model/context_split.h: each rank holds T = seq_len/C tokens, chunks r and 2C − 1 − r), in
// one of two ways:
//
// - ring (Liu et al., "Ring Attention with Blockwise Transformers", arXiv 2310.01889; as
//   Megatron-Core runs it): the keys and values of every rank travel around the ring, one
//   block per step, C steps; each rank attends its queries to each block it holds
//   (Ops::attention_block_forward) and merges the blocks' results by their log-sum-exp
//   (Ops::attention_merge), skipping the (query chunk, key chunk) pairs the causal mask hides
//   whole: with the two-chunk split every rank computes the same number of blocks. Backward
//   passes the keys and values around again, and with them each block's dk, dv (fp32), which
//   arrive back at their owner after C hops.
// - ulysses (Jacobs et al., "DeepSpeed Ulysses", arXiv 2309.14509): an all-to-all turns q, k, v
//   from a split by tokens into a split by heads (each rank all seq_len tokens of heads/C of
//   its heads, in sequence order), Ops::attention_forward runs as without the split, and an
//   all-to-all turns the output back; backward mirrors it. The heads must divide by M·C.
//
// Shapes (this rank, M-way tensor parallelism included): B sequences, T tokens each, N = B·T
// rows; Hm = H/M channels and `heads` = NH/M heads. A layer keeps, for its backward, `qkv`
// (N, 3Hm) — ring: the rank's own q, k, v; ulysses: the head-split q, k, v (B, seq_len,
// 3Hm/C) — the output (N, Hm), ulysses also the head-split output (B, seq_len, Hm/C), and what
// attention keeps: ring the fp32 log-sum-exp (B, heads, T), ulysses what Ops::attention_forward
// keeps for (B, heads/C, seq_len). Dropout's masks are the unsplit model's (the ops draw by
// sequence position and global head). The exchange buffers are the model's scratch.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "model/attention_core.h"

namespace trident::model {

class ContextAttention final : public AttentionCore {
public:
    ContextAttention(const Dims& d, int head_begin, int heads_total,
                     const AttentionSavedFn& attention_saved, SetSpec& set, ScratchSpec& scratch);

    kernels::Ptr qkv_target(PartContext& ctx, kernels::Ptr qkv) const override;
    void forward(PartContext& ctx, const Pass& pass, kernels::Ptr qkv, kernels::Ptr out,
                 float drop) const override;
    void rebuild(PartContext& ctx, const Pass& pass, kernels::ConstPtr qkv,
                 float drop) const override;
    void backward(PartContext& ctx, const Pass& pass, kernels::Ptr dqkv, kernels::ConstPtr dout,
                  kernels::ConstPtr qkv, kernels::ConstPtr out, float drop) const override;

private:
    // Ring: one block of (this rank's query half qa, the held rank's key half kb) of the pass's
    // microbatch (its dropout seed, its documents' starts).
    kernels::AttentionBlock block(const PartContext& ctx, const Pass& pass, int source, int qa,
                                  int kb, float drop) const;
    // Whether query half qa sees any of key half kb of rank `source`.
    bool visible(const PartContext& ctx, int source, int qa, int kb) const;
    // Exchange with the ring's neighbours: `send` to the next rank, `receive` from the previous.
    void ring_exchange(PartContext& ctx, kernels::ConstPtr send, kernels::Ptr receive,
                       std::size_t count, int tag) const;
    void ring_forward(PartContext& ctx, const Pass& pass, kernels::Ptr out, kernels::ConstPtr qkv,
                      float* lse, float drop) const;
    void ring_backward(PartContext& ctx, const Pass& pass, kernels::Ptr dqkv,
                       kernels::ConstPtr dout, kernels::ConstPtr qkv, kernels::ConstPtr out,
                       const float* lse, float drop) const;
    // Ulysses: `parts` side-by-side tensors of Hm channels each between the token split
    // (N, parts·Hm) and the head split (B, seq_len, parts·Hm/C) in sequence order.
    void to_heads(PartContext& ctx, kernels::ConstPtr local, kernels::Ptr heads, int parts) const;
    void to_tokens(PartContext& ctx, kernels::ConstPtr heads, kernels::Ptr local, int parts) const;
    int ulysses_heads() const { return heads_ / ranks_; }

    bool ring_;
    int B_, seq_len_, T_, S_;  // sequences, tokens of a whole one, this rank's, a chunk's
    int Hm_, heads_, head_begin_, heads_total_;
    int ranks_;
    std::size_t rows_;            // N = B·T
    int saved_, out_heads_ = -1;  // slots: what attention keeps; Ulysses' head-split output
    // Ring scratch: the keys and values held and arriving (N, 2Hm); the running output (or,
    // backward, dq) and one block's output (N, Hm), its log-sum-exp (B, heads, T), and the
    // dk, dv held and arriving (N, 2Hm), all fp32.
    std::array<int, 2> kv_{-1, -1}, dkv_{-1, -1};
    int rows_f32_ = -1, block_out_ = -1, block_lse_ = -1;
    // Ulysses scratch: this rank's tokens' q, k, v (forward), then the head-split gradient of
    // q, k, v (backward) (N, 3Hm); the exchange's buffers (N, 3Hm); the head-split gradient of
    // the output (N, Hm).
    int qkv_tokens_ = -1, send_ = -1, receive_ = -1, dout_heads_ = -1;
};

}  // namespace trident::model
