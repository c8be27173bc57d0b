// The GEMM behind a linear layer, as a policy: how y = x·Wᵀ + b and its gradients are computed
// from the linear's weights in the parameter buffer. DenseGemm, the default, is the backend's
// matmul on the weights as they are (Ops::matmul_forward, matmul_backward). Another numeric
// format is another policy, chosen by the part options (PartOptions::gemm) and nothing else:
// FP8 (scaled 8-bit operands, amax history per linear) quantizes x and W around a scaled GEMM;
// a 4-bit base (QLoRA's NF4) dequantizes its codes into a tile before the product. The linear
// (model/linear.h), its split and its exchanges do not change.
#pragma once

#include <cstddef>

#include "model/param_layout.h"
#include "model/part_context.h"

namespace trident::model {

// A linear's weights on this rank: offsets in Weights::params (and grads), its widths.
struct LinearWeights {
    std::size_t weight = 0, bias = kNoParam;  // W (out, in), b (out) or none
    int in = 0, out = 0;
};

class GemmPolicy {
public:
    virtual ~GemmPolicy() = default;
    // y (rows, out) = x (rows, in)·Wᵀ, plus b when `bias` (and the linear has one).
    virtual void forward(PartContext& ctx, const LinearWeights& w, kernels::Ptr y,
                         kernels::ConstPtr x, int rows, bool bias) const = 0;
    // dx (rows, in) += dy·W unless dx is null; with `weights`, dW (out, in) += dyᵀ·x and
    // db (out) += the column sums of dy. W is read only for dx (a weight gradient alone does
    // not need it resident: ZeRO-3 need not have gathered it).
    virtual void backward(PartContext& ctx, const LinearWeights& w, kernels::Ptr dx, bool weights,
                          kernels::ConstPtr dy, kernels::ConstPtr x, int rows) const = 0;
};

// The backend's matmul on the weights as they are.
const GemmPolicy& dense_gemm();

}  // namespace trident::model
