// A split linear y = x·Wᵀ + b (Megatron-LM's ColumnParallelLinear and RowParallelLinear,
// Shoeybi et al., arXiv 1909.08053, §3): its weight and bias in the parameter buffer, the
// tensor group's exchanges around it (model/tensor_rows.h), its optional low-rank adapter
// (model/lora_adapter.h), and what a split backward keeps between its two halves.
//
// - column: W holds this rank's rows of the output (out = the whole out / M). The input is
//   this rank's rows of the residual stream (R, in), all-gathered to (N, in) first under
//   sequence parallelism (kept for the weight gradient); the output (N, out) stays split. The
//   input's gradient is reduced over the group (all-reduce, or reduce-scatter to rows).
// - row: W holds this rank's columns of the input (in = the whole in / M). The input (N, in)
//   is split; the partial outputs are reduced over the group to this rank's rows (R, out) and
//   the bias, whole, is added once after. The output's gradient is all-gathered to all rows
//   first under sequence parallelism.
// With M = 1 both are the whole linear and nothing moves.
//
// Three calls: forward; backward, which gives the input's gradient and, as asked, the
// parameters' too (BackwardPart::both) or keeps the output's gradient for them (input: a
// zero-bubble schedule's B); backward_weight, the parameters' gradients from what B kept (W).
// The additions into every gradient are those of the plain backward, so the results are bitwise
// the same (docs/ARCHITECTURE.md, "Schedules").
#pragma once

#include <cstddef>
#include <vector>

#include "model/buffer_spec.h"
#include "model/lora_adapter.h"
#include "model/part_context.h"

namespace trident::model {

enum class LinearSplit { column, row };

struct LinearSpec {
    LinearSplit split = LinearSplit::column;
    int in = 0, out = 0;                      // this rank's widths
    std::size_t weight = 0, bias = kNoParam;  // offsets in Weights::params
    // Its adapters: none, one over the whole output, or one per block of it (llama's q, k, v).
    std::vector<LoraSpec> lora;
    // Whether a split backward keeps dy for W here (the LM head keeps its own: the logits'
    // buffer turned into their gradient).
    bool stash = true;
};

class Linear {
public:
    Linear(const LinearSpec& spec, const Dims& d, SetSpec& set, ScratchSpec& scratch);

    // column: y (N, out) from this rank's rows x (R, in); returns y. row: from x (N, in), this
    // rank's rows of the output (R, out) in the scratch, returned (y unused).
    kernels::Ptr forward(PartContext& ctx, const Pass& pass, kernels::ConstPtr x,
                         kernels::Ptr y) const;
    // column: from dy (N, out), this rank's rows of the input's gradient (R, in), in the
    // scratch. row: from this rank's rows of dy (R, out), the input's gradient (N, in), in the
    // scratch. `x` as forward had it.
    kernels::ConstPtr backward(PartContext& ctx, const Pass& pass, kernels::ConstPtr x,
                               kernels::ConstPtr dy, BackwardPart part) const;
    // The parameters' gradients from what backward kept (BackwardPart::input), or from dy (N,
    // out) as the GEMM reads it.
    void backward_weight(PartContext& ctx, const Pass& pass, kernels::ConstPtr x) const;
    void weight_gradient(PartContext& ctx, const Pass& pass, kernels::ConstPtr x,
                         kernels::ConstPtr dy) const;
    // After the step's last backward: the adapters' whole factors summed
    // (model/lora_adapter.h).
    void finish_grads(PartContext& ctx) const;
    // The adapters' h alone (full recompute reruns a layer's forward only up to a row-split
    // linear's input, but its backward reads h).
    void adapter_down(PartContext& ctx, const Pass& pass, kernels::ConstPtr x) const;

private:
    // The input as the GEMM reads it: all rows (column, gathered under sequence parallelism).
    kernels::ConstPtr gemm_input(const Pass& pass, kernels::ConstPtr x) const;

    LinearSpec spec_;
    std::vector<LoraAdapter> lora_;
    int input_all_ = -1;     // slot: column's gathered input (N, in), sequence parallel only
    int stash_ = -1;         // slot: dy (N, out) kept by a split backward
    int partial_, reduced_;  // scratch: row's partial output (N, out), its rows (R, out)
    int d_input_, d_rows_;   // scratch: the input's gradient (N, in), its rows (R, in)
    int d_output_all_;       // scratch: row's gathered output gradient (N, out)
    int ring_sums_;          // scratch: the reduce-scatter's running sums (2, R, out or in)
};

}  // namespace trident::model
