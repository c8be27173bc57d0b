// Qwen3's query and key norms (`model.qk_norm`; Hugging Face's Qwen3Attention q_norm and
// k_norm, docs/ARCHITECTURE.md "The model"): an RMSNorm over each head's channels of the
// queries and of the keys, after the q and k linears and before rotary positions, with one
// weight of the head size for every query head and one for every key head.
//
// Shapes (this rank, hs the head size, N rows): the grouped linear's output g (N, Hm + 2·KVm),
// normalized in place in its q (N, Hm) and k (N, KVm) columns; kept for the backward: those
// columns before the norm and the rstd of each (row, head), (N·heads) and (N·kv_heads) fp32;
// the weights (hs) each, replicated over the tensor ranks. Each tensor rank's heads give a
// partial sum of the weights' gradients (with M > KVH a replica's key head only its query
// heads' share), summed over the tensor group in finish_grads.
#pragma once

#include <cstddef>

#include "model/activation_store.h"
#include "model/dims.h"
#include "model/part_context.h"

namespace trident::model {

class QkNorm {
public:
    // `q_weight`, `k_weight`: the two weights' offsets in the parameter buffer.
    QkNorm(std::size_t q_weight, std::size_t k_weight, float eps, const Dims& d, SetSpec& set,
           ScratchSpec& scratch);

    // g (N, Hm + 2·KVm): q and k normalized in place.
    void forward(PartContext& ctx, const Pass& pass, kernels::Ptr g) const;
    // dg (N, Hm + 2·KVm): the q and k columns' gradients, of the normalized values on entry, of
    // the values before the norm on return; the weights' gradients added unless `part` is a
    // split backward's input part (then kept for backward_weight).
    void backward(PartContext& ctx, const Pass& pass, kernels::Ptr dg, BackwardPart part) const;
    void backward_weight(PartContext& ctx, const Pass& pass) const;
    void finish_grads(PartContext& ctx) const;

private:
    // The q or the k columns: where they lie in g's rows and what is kept of them.
    struct Block {
        std::size_t weight = 0;
        std::size_t column = 0, width = 0;  // g's columns column .. + width
        int heads = 0;                      // width / hs
        int input = -1, rstd = -1;          // slots: (N, width) before the norm, (N·heads) f32
        WeightGradStash stash;              // the normalized columns' gradient, for W
    };
    void gradient(PartContext& ctx, const Pass& pass, const Block& b, kernels::ConstPtr dy,
                  kernels::Ptr dx) const;

    Block q_, k_;
    float eps_;
    std::size_t rows_, row_;  // N, g's row (Hm + 2·KVm)
    int hs_;
    int dy_, dx_;  // scratch: one block's gradients gathered (N, Hm)
};

}  // namespace trident::model
