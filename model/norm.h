// The normalisation before each sublayer and before the LM head, on this rank's rows of the
// residual stream (R, H). Its weights are whole on every tensor rank; under sequence
// parallelism each rank sees its rows only, so their gradients are partial sums, summed over
// the tensor group once per step (finish_grads), as Megatron-LM does.
//
// A norm is one kind of part (docs/ARCHITECTURE.md, "How to add a layer kind"): GPT-2's
// LayerNorm and Llama's RMSNorm here; another normalisation is another implementation of Norm.
#pragma once

#include <cstddef>

#include "model/activation_store.h"
#include "model/buffer_spec.h"
#include "model/part_context.h"

namespace trident::model {

class Norm {
public:
    virtual ~Norm() = default;
    // out (R, H) = norm(x), into the set; returns it.
    virtual kernels::ConstPtr forward(PartContext& ctx, const Pass& pass,
                                      kernels::ConstPtr x) const = 0;
    virtual kernels::ConstPtr output(const Pass& pass) const = 0;
    // dx (R, H) += the input's gradient from dout (R, H); the weights' gradients too, or
    // (BackwardPart::input) dout kept for backward_weight.
    virtual void backward(PartContext& ctx, const Pass& pass, kernels::ConstPtr x,
                          kernels::ConstPtr dout, kernels::Ptr dx, BackwardPart part) const = 0;
    virtual void backward_weight(PartContext& ctx, const Pass& pass, kernels::ConstPtr x) const = 0;
    virtual void finish_grads(PartContext& ctx) const = 0;
};

// LayerNorm (eps 1e-5): out = (x − mean)·rstd·w + b, mean and rstd (R) kept in fp32.
class LayerNorm final : public Norm {
public:
    // `weight`, `bias`: offsets of (H) each in the parameter buffer.
    LayerNorm(std::size_t weight, std::size_t bias, const Dims& d, SetSpec& set);

    kernels::ConstPtr forward(PartContext& ctx, const Pass& pass,
                              kernels::ConstPtr x) const override;
    kernels::ConstPtr output(const Pass& pass) const override { return pass.buffers[out_]; }
    void backward(PartContext& ctx, const Pass& pass, kernels::ConstPtr x, kernels::ConstPtr dout,
                  kernels::Ptr dx, BackwardPart part) const override;
    void backward_weight(PartContext& ctx, const Pass& pass, kernels::ConstPtr x) const override;
    void finish_grads(PartContext& ctx) const override;

private:
    void gradient(PartContext& ctx, const Pass& pass, kernels::ConstPtr x, kernels::ConstPtr dout,
                  kernels::Ptr dx, bool weights) const;

    std::size_t weight_, bias_;
    int out_, mean_, rstd_;  // slots: (R, H), (R), (R)
    WeightGradStash stash_;  // dout (R, H), kept by a split backward
};

// RMSNorm (Llama): out = x·rstd·w, rstd = 1/sqrt(mean(x²) + eps) (R) kept in fp32.
class RmsNorm final : public Norm {
public:
    // `weight`: offset of (H) in the parameter buffer.
    RmsNorm(std::size_t weight, float eps, const Dims& d, SetSpec& set);

    kernels::ConstPtr forward(PartContext& ctx, const Pass& pass,
                              kernels::ConstPtr x) const override;
    kernels::ConstPtr output(const Pass& pass) const override { return pass.buffers[out_]; }
    void backward(PartContext& ctx, const Pass& pass, kernels::ConstPtr x, kernels::ConstPtr dout,
                  kernels::Ptr dx, BackwardPart part) const override;
    void backward_weight(PartContext& ctx, const Pass& pass, kernels::ConstPtr x) const override;
    void finish_grads(PartContext& ctx) const override;

private:
    void gradient(PartContext& ctx, const Pass& pass, kernels::ConstPtr x, kernels::ConstPtr dout,
                  kernels::Ptr dx, bool weights) const;

    std::size_t weight_;
    float eps_;
    int out_, rstd_;         // slots: (R, H), (R)
    WeightGradStash stash_;  // dout (R, H), kept by a split backward
};

}  // namespace trident::model
