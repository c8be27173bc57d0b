// Causal attention over a sequence split over the C ranks of a context-parallel group
// (model/context_split.h: each rank holds T_l = T/C tokens, chunks r and 2C − 1 − r), in one
// of two ways:
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
//   from a split by tokens into a split by heads (each rank all T tokens of NH/C of its heads,
//   in sequence order), Ops::attention_forward runs as without the split, and an all-to-all
//   turns the output back; backward mirrors it. The heads must divide by M·C.
//
// Shapes (this rank, M-way tensor parallelism included): B sequences, T_l tokens each,
// N_l = B·T_l rows; Cm = C/M channels and NHm = NH/M heads. A layer keeps, for its backward,
// `qkv` (N_l, 3Cm) — ring: the rank's own q, k, v; ulysses: the head-split q, k, v
// (B, T, 3Cm/C) — the output `out` (N_l, Cm), ulysses also the head-split output `out_heads`
// (B, T, Cm/C), and `saved` (saved_count() elements of saved_type()): ring the fp32
// log-sum-exp (B, NHm, T_l), ulysses what Ops::attention_forward keeps for (B, NHm/C, T).
// Dropout's masks are the unsplit model's (the ops draw by sequence position and global head).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "kernels/ops.h"
#include "model/device_buffer.h"
#include "parallel/comm.h"

namespace trident::model {

enum class ContextMode { ring, ulysses };

// A layer's attention under context parallelism: its shape on this rank.
struct ContextShape {
    int B = 0;           // sequences of a microbatch
    int T = 0;           // tokens of a whole sequence
    int C = 0;           // this rank's channels (hidden / M)
    int NH = 0;          // this rank's heads (heads / M)
    int head_begin = 0;  // the first of them among heads_total (tensor parallelism)
    int heads_total = 0;
};

class ContextAttention {
public:
    ContextAttention(kernels::Ops& ops, parallel::Comm& group, ContextMode mode,
                     const ContextShape& shape, kernels::DType activations);

    ContextMode mode() const { return mode_; }
    int local_tokens() const { return T_local_; }
    // What a layer keeps besides qkv and out (see the top of this file).
    std::size_t saved_count() const { return saved_.count; }
    kernels::DType saved_type() const { return saved_.dtype; }
    bool keeps_out_heads() const { return mode_ == ContextMode::ulysses; }
    // Where the qkv GEMM writes this rank's q, k, v (N_l, 3Cm): the layer's `qkv` itself
    // (ring), or scratch that forward turns into the head-split `qkv` (ulysses).
    kernels::Ptr qkv_input(kernels::Ptr kept_qkv) const;

    // out (N_l, Cm) from qkv_input; fills the layer's qkv (ulysses), out_heads and saved.
    void forward(kernels::Ptr out, kernels::Ptr qkv, kernels::Ptr out_heads, kernels::Ptr saved,
                 float drop_prob, uint64_t seed);
    // saved again from the layer's qkv, bit for bit (selective recompute; ulysses only: the
    // ring's log-sum-exp is always kept, as small as a flash kernel's).
    void rebuild(kernels::Ptr saved, kernels::ConstPtr qkv, float drop_prob);
    // dqkv (N_l, 3Cm) = the gradient of this rank's q, k, v (overwritten), from the gradient
    // dout (N_l, Cm) of the output and what the layer kept.
    void backward(kernels::Ptr dqkv, kernels::ConstPtr dout, kernels::ConstPtr qkv,
                  kernels::ConstPtr out, kernels::ConstPtr out_heads, kernels::ConstPtr saved,
                  float drop_prob, uint64_t seed);

private:
    // Ring: one block of (this rank's query half qa, the held rank's key half kb).
    kernels::AttentionBlock block(int source, int qa, int kb, float drop_prob, uint64_t seed) const;
    // Whether query half qa sees any of key half kb of rank `source`, and whether it is the
    // diagonal (the first block a query half meets, written rather than merged).
    bool visible(int source, int qa, int kb) const;
    // Exchange with the ring's neighbours: `send` to the next rank, `receive` from the
    // previous one.
    void ring_exchange(kernels::ConstPtr send, kernels::Ptr receive, std::size_t count, int tag);
    void ring_forward(kernels::Ptr out, kernels::ConstPtr qkv, float* lse, float drop_prob,
                      uint64_t seed);
    void ring_backward(kernels::Ptr dqkv, kernels::ConstPtr dout, kernels::ConstPtr qkv,
                       kernels::ConstPtr out, const float* lse, float drop_prob, uint64_t seed);
    // Ulysses: `parts` side-by-side tensors of Cm channels each between the token split
    // (N_l, parts·Cm) and the head split (B, T, parts·Cm/C) in sequence order.
    void to_heads(kernels::ConstPtr local, kernels::Ptr heads, int parts);
    void to_tokens(kernels::ConstPtr heads, kernels::Ptr local, int parts);

    kernels::Ops& ops_;
    parallel::Comm& group_;
    ContextMode mode_;
    ContextShape s_;
    int ranks_, rank_;  // C and this rank's place
    int T_local_, S_;   // tokens per rank (T/C) and per chunk (T/2C)
    std::size_t rows_;  // N_l = B·T_l
    kernels::DType act_;
    kernels::Ops::AttentionSaved saved_;

    // Ring: the keys and values held and those arriving (N_l, 2Cm); the running output (or,
    // backward, dq) and one block's output (N_l, Cm), its log-sum-exp (B, NHm, T_l), and the
    // dk, dv held and arriving (N_l, 2Cm), all fp32.
    std::array<DeviceBuffer, 2> kv_, dkv_;
    DeviceBuffer rows_f32_, block_out_, block_lse_;
    // Ulysses: the q, k, v of this rank's tokens (forward), then the head-split gradient of
    // q, k, v (backward) (N_l, 3Cm); the exchange's buffers (N_l, 3Cm); the head-split
    // gradient of the output (N_l, Cm).
    DeviceBuffer qkv_tokens_, send_, receive_, dout_heads_;
};

}  // namespace trident::model
