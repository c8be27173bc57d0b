// A split linear wrapped by its low-rank adapters (LoRA, model/lora_adapter.h): the linear
// (model/linear.h) computes as it would alone, and the adapters add s·B·(A·drop(x)) at the
// points it offers: into its output before the tensor group reduces it (a row-split linear's
// partial output, so the adapters add no collective of their own), into its input's gradient
// before that is reduced, and their factors' gradients beside its weights'. The linear then
// runs no GEMM in pieces where a reduction follows (the adapters add into the whole), and
// its base weights train or stay frozen as the model says (Weights::frozen).
#pragma once

#include <vector>

#include "model/linear.h"
#include "model/lora_adapter.h"

namespace trident::model {

class LoraLinear final : public Linear {
public:
    // The linear of `spec` and its adapters (spec.lora), their buffers declared after its own.
    LoraLinear(const LinearSpec& spec, const Dims& d, SetSpec& set, ScratchSpec& scratch);

    // After the step's last backward: the adapters' whole factors summed over the tensor group.
    void finish_grads(PartContext& ctx) const override;
    // The adapters' h from the linear's input (its backward reads it).
    void rebuild(PartContext& ctx, const Pass& pass, kernels::ConstPtr x) const override;

private:
    bool adds() const override { return true; }
    void add_output(PartContext& ctx, const Pass& pass, kernels::ConstPtr x,
                    kernels::Ptr y) const override;
    void add_input_grad(PartContext& ctx, const Pass& pass, kernels::ConstPtr x,
                        kernels::ConstPtr dy, kernels::Ptr dx, bool weights) const override;
    void add_weight_grads(PartContext& ctx, const Pass& pass, kernels::ConstPtr x,
                          kernels::ConstPtr dy) const override;

    std::vector<LoraAdapter> adapters_;
};

}  // namespace trident::model
