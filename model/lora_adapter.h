// The low-rank adapter of one split linear (Hu et al., "LoRA: Low-Rank Adaptation of Large
// Language Models", 2021): y += s·(drop(x)·Aᵀ)·Bᵀ beside the frozen y = x·Wᵀ, s = alpha / r.
//
// The adapter follows its linear's split so that the forward needs no collective of its own
// (docs/ARCHITECTURE.md, "Low-rank adapters"): beside a column-split linear A (r, in) is whole
// and B holds the linear's rows, so each rank computes h = drop(x)·Aᵀ itself; beside a
// row-split linear A holds the linear's columns and each rank's partial h·Bᵀ joins the partial
// output the linear's reduction sums, B whole. The whole factor's gradient is then a partial
// sum on each tensor rank, summed over the tensor group once per step (finish_grads).
//
// Dropout on the adapter's input draws each element's mask at its index in the whole input
// (B, seq_len, whole in), so every split draws the masks of one process.
//
// An adapter may cover a block of its linear's output columns: llama's q, k and v (and gate
// and up) run as one linear, each with an adapter of its own over its block of this rank's
// output (N, Hm + 2·KVm) (or (N, 2Fm)).
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/buffer_spec.h"
#include "model/part_context.h"

namespace trident::model {

// What a linear's adapter is: its factors' offsets in the adapters' buffer, the scale and
// dropout of every adapter, and which target it is (its dropout masks' stream).
struct LoraSpec {
    std::size_t a = 0, b = 0;  // A (r, in), B (out, r) in Weights::lora_params
    int rank = 0;
    float scale = 0, dropout = 0;
    int target = 0;
    // The block of the linear's output (N, out) the adapter adds to: columns first ..
    // first + width (width 0: all of them).
    int first = 0, width = 0;
};

class LoraAdapter {
public:
    // `in`, `out`: the linear's widths on this rank; `whole_in`, `column`: its input's whole
    // width and where this rank's columns start (a row-split linear's input is split).
    // The adapter's own output is spec.width of the out columns (all of them if 0).
    LoraAdapter(const LoraSpec& spec, const Dims& d, int in, int out, int whole_in, int column,
                bool row_split, SetSpec& set, ScratchSpec& scratch);

    // h = s·drop(x)·Aᵀ (N, r) into the set, from the linear's input x (N, in).
    void down(PartContext& ctx, const Pass& pass, kernels::ConstPtr x) const;
    // y (N, out) += h·Bᵀ, in the adapter's block of columns.
    void up(PartContext& ctx, const Pass& pass, kernels::Ptr y) const;
    // From the gradient dy (N, out) of the linear's output (its block's columns): with
    // `weights` dB += dyᵀ·h and
    // dA += gᵀ·drop(x) (g = s·dy·B); with `inputs` dx (N, in) += g·A through the dropout.
    void backward(PartContext& ctx, const Pass& pass, kernels::ConstPtr x, kernels::ConstPtr dy,
                  kernels::Ptr dx, bool inputs, bool weights) const;
    // After the step's last backward: the whole factor's gradient summed over the tensor group.
    void finish_grads(PartContext& ctx) const;

private:
    float drop(const Pass& pass) const { return pass.drop(spec_.dropout); }
    uint64_t seed(const Pass& pass) const;
    // x with the adapter's dropout, into the scratch (x itself without dropout).
    kernels::ConstPtr dropped(PartContext& ctx, const Pass& pass, kernels::ConstPtr x) const;
    bool whole_output() const { return width_ == out_; }

    LoraSpec spec_;
    int in_, out_, whole_in_, column_;
    int width_;  // the adapter's output columns (its B's rows), out_ or a block of them
    bool row_split_;
    int h_;          // slot: h (N, r)
    int x_, y_, g_;  // scratch: drop(x) (N, in), h·Bᵀ (N, width), g (N, r)
    int block_;      // scratch: the block of y or dy (N, width), a block adapter only
};

}  // namespace trident::model
