// A split linear y = x·Wᵀ + b (Megatron-LM's ColumnParallelLinear and RowParallelLinear,
// Shoeybi et al., arXiv 1909.08053, §3): one concern, the linear, with the others composed
// around it:
// - its split and the tensor group's exchanges around the product (the plan below; the
//   exchanges' rows and their strategy, serial or overlapped under parallel.tp_overlap, are
//   model/tensor_rows.h's);
// - the product itself behind a GEMM policy (model/gemm.h: dense today; FP8 or a 4-bit base's
//   dequantizing GEMM tomorrow);
// - what a split backward keeps for its W, in the activation store (WeightGradStash);
// - low-rank adapters, which wrap a linear (LoraLinear, model/lora_adapter.h) through the
//   three points a linear offers: its output before it is reduced, its input's gradient
//   before it is reduced, its weights' gradient.
//
// The plan:
// - column: W holds this rank's rows of the output (out = the whole out / M). The input is
//   this rank's rows of the residual stream (R, in), all-gathered to (N, in) first under
//   sequence parallelism (kept for the weight gradient); the output (N, out) stays split. The
//   input's gradient is reduced over the group (all-reduce, or reduce-scatter to rows).
// - row: W holds this rank's columns of the input (in = the whole in / M). The input (N, in)
//   is split; the partial outputs are reduced over the group to this rank's rows (R, out) and
//   the bias, whole, is added once after. The output's gradient is all-gathered to all rows
//   first under sequence parallelism.
// With M = 1 both are the whole linear and nothing moves. Under sequence parallelism the GEMM
// on exchanged rows runs block by block, R rows each, inside the exchange (its pieces), unless
// something must add into the whole partial product before it is reduced (an adapter).
//
// Three calls: forward; backward, which gives the input's gradient and, as asked, the
// parameters' too (BackwardPart::both) or keeps the output's gradient for them (input: a
// zero-bubble schedule's B); backward_weight, the parameters' gradients from what B kept (W).
// The additions into every gradient are those of the plain backward, so the results are bitwise
// the same (docs/ARCHITECTURE.md, "Schedules").
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "model/activation_store.h"
#include "model/buffer_spec.h"
#include "model/gemm.h"
#include "model/lora_adapter.h"
#include "model/part_context.h"

namespace trident::model {

enum class LinearSplit { column, row };

struct LinearSpec {
    LinearSplit split = LinearSplit::column;
    int in = 0, out = 0;                      // this rank's widths
    std::size_t weight = 0, bias = kNoParam;  // offsets in Weights::params
    // The adapters wrapping it (make_linear): none, one over the whole output, or one per
    // block of it (llama's q, k, v).
    std::vector<LoraSpec> lora;
    // Whether a split backward keeps dy for W here (the LM head keeps its own: the logits'
    // buffer turned into their gradient).
    bool stash = true;
    const GemmPolicy* gemm = nullptr;  // null: dense_gemm()
};

class Linear {
public:
    Linear(const LinearSpec& spec, const Dims& d, SetSpec& set, ScratchSpec& scratch);
    virtual ~Linear() = default;

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
    // After the step's last backward: partial sums of what wraps it, summed.
    virtual void finish_grads(PartContext& ctx) const { (void)ctx; }
    // What its backward reads besides its input, rebuilt from the input x: full recompute
    // reruns a layer's forward only up to a row-split linear's input.
    virtual void rebuild(PartContext& ctx, const Pass& pass, kernels::ConstPtr x) const {
        (void)ctx, (void)pass, (void)x;
    }

protected:
    // The points a wrapper adds at (none here): whether it adds into the whole product (then
    // no GEMM runs in pieces where a reduction follows), into the output y (N, out) from the
    // GEMM's input (N, in) before any reduction, into the input's gradient dx (N, in) from the
    // output's gradient (N, out) before any reduction (with `weights`, into its own too), and
    // into its weights' gradients alone.
    virtual bool adds() const { return false; }
    virtual void add_output(PartContext& ctx, const Pass& pass, kernels::ConstPtr x,
                            kernels::Ptr y) const;
    virtual void add_input_grad(PartContext& ctx, const Pass& pass, kernels::ConstPtr x,
                                kernels::ConstPtr dy, kernels::Ptr dx, bool weights) const;
    virtual void add_weight_grads(PartContext& ctx, const Pass& pass, kernels::ConstPtr x,
                                  kernels::ConstPtr dy) const;

    const LinearSpec& spec() const { return spec_; }

private:
    // The input as the GEMM reads it: all rows (column, gathered under sequence parallelism).
    kernels::ConstPtr gemm_input(const Pass& pass, kernels::ConstPtr x) const;
    // The GEMM of block b (R rows) of `from` into `to` (forward), or of dx from dy (backward).
    TensorRows::BlockFn output_blocks(PartContext& ctx, kernels::Ptr to, kernels::ConstPtr from,
                                      bool bias) const;
    TensorRows::BlockFn input_grad_blocks(PartContext& ctx, kernels::Ptr dx, kernels::ConstPtr dy,
                                          kernels::ConstPtr x) const;
    kernels::Ptr column_forward(PartContext& ctx, const Pass& pass, kernels::ConstPtr x,
                                kernels::Ptr y) const;
    kernels::Ptr row_forward(PartContext& ctx, const Pass& pass, kernels::ConstPtr x) const;

    LinearSpec spec_;
    const GemmPolicy& gemm_;
    LinearWeights weights_;
    WeightGradStash stash_;  // dy (N, out) kept by a split backward
    int input_all_ = -1;     // slot: column's gathered input (N, in), sequence parallel only
    int partial_, reduced_;  // scratch: row's partial output (N, out), its rows (R, out)
    int d_input_, d_rows_;   // scratch: the input's gradient (N, in), its rows (R, in)
    int d_output_all_;       // scratch: row's gathered output gradient (N, out)
    int ring_sums_;          // scratch: the reduce-scatter's running sums (2, R, out or in)
};

// The linear `spec` asks for: wrapped by its adapters (LoraLinear) when it has any.
std::unique_ptr<Linear> make_linear(const LinearSpec& spec, const Dims& d, SetSpec& set,
                                    ScratchSpec& scratch);

}  // namespace trident::model
