// Causal self-attention between the q, k and v of this rank's heads: the part of a layer
// between its qkv linear and its output projection. Three strategies, one interface:
// - local: the whole sequence on this rank (Ops::attention_forward, the backend's kernel), within
//   the microbatch's documents under data.documents: mask (model/documents.h);
// - ring and Ulysses: the sequence split over the context group (model/context_attention.h).
//
// Shapes (this rank): qkv (N, 3Hm), q, k and v side by side, each (B, T, heads, Hm/heads);
// the output (N, Hm). What a core keeps for its backward (the backend's `saved`) is in the set
// under Keep::unless_recompute (selective recompute rebuilds it from qkv), or unless_full where
// it is as small as anything recompute could keep instead (ring attention's log-sum-exp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "kernels/ops.h"
#include "model/buffer_spec.h"
#include "model/part_context.h"

namespace trident::model {

// What the backend's attention keeps for a problem of (B, heads, T) in activations of a type
// (Ops::attention_saved): the model asks its Ops, the planner the CPU backend's rule.
using AttentionSavedFn =
    std::function<kernels::Ops::AttentionSaved(int B, int heads, int T, kernels::DType act)>;

class AttentionCore;

// Builds a layer's core of this rank's heads among `heads_total`, from `head_begin`, declaring
// its buffers; empty: training's (local, or ring or Ulysses over the context group). Generation
// gives its own (model/kv_cache.h).
using MakeCore = std::function<std::unique_ptr<AttentionCore>(const Dims& d, int head_begin,
                                                              int heads_total, SetSpec& set)>;

class AttentionCore {
public:
    virtual ~AttentionCore() = default;
    // Where the qkv GEMM writes this rank's q, k, v: the set's `qkv` itself, or a buffer the
    // forward turns into it.
    virtual kernels::Ptr qkv_target(PartContext& ctx, kernels::Ptr qkv) const {
        (void)ctx;
        return qkv;
    }
    // out (N, Hm) from qkv; fills what the core keeps.
    virtual void forward(PartContext& ctx, const Pass& pass, kernels::Ptr qkv, kernels::Ptr out,
                         float drop) const = 0;
    // What selective recompute dropped, rebuilt bit for bit from qkv (nothing if it is kept).
    virtual void rebuild(PartContext& ctx, const Pass& pass, kernels::ConstPtr qkv,
                         float drop) const = 0;
    // dqkv (N, 3Hm) += the gradient of q, k, v, from dout (N, Hm).
    virtual void backward(PartContext& ctx, const Pass& pass, kernels::Ptr dqkv,
                          kernels::ConstPtr dout, kernels::ConstPtr qkv, kernels::ConstPtr out,
                          float drop) const = 0;
};

// The whole sequence on this rank.
class LocalAttention final : public AttentionCore {
public:
    LocalAttention(const Dims& d, int head_begin, int heads_total,
                   const AttentionSavedFn& attention_saved, SetSpec& set);
    void forward(PartContext& ctx, const Pass& pass, kernels::Ptr qkv, kernels::Ptr out,
                 float drop) const override;
    void rebuild(PartContext& ctx, const Pass& pass, kernels::ConstPtr qkv,
                 float drop) const override;
    void backward(PartContext& ctx, const Pass& pass, kernels::Ptr dqkv, kernels::ConstPtr dout,
                  kernels::ConstPtr qkv, kernels::ConstPtr out, float drop) const override;

private:
    int head_begin_, heads_total_;
    int saved_;  // slot
};

}  // namespace trident::model
