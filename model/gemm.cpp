// The default GEMM policy (see gemm.h).
#include "model/gemm.h"

namespace trident::model {

using kernels::ConstPtr;
using kernels::Ptr;

namespace {

class DenseGemm final : public GemmPolicy {
public:
    void forward(PartContext& ctx, const LinearWeights& w, Ptr y, ConstPtr x, int rows,
                 bool bias) const override {
        const FlatBuffer& params = ctx.weights.params;
        const ConstPtr b = bias && w.bias != kNoParam ? ConstPtr(params.at(w.bias)) : ConstPtr();
        ctx.ops.matmul_forward(y, x, params.at(w.weight), b, rows, w.in, w.out);
    }

    void backward(PartContext& ctx, const LinearWeights& w, Ptr dx, bool weights, ConstPtr dy,
                  ConstPtr x, int rows) const override {
        if (!dx && !weights) return;
        const FlatBuffer& params = ctx.weights.params;
        const FlatBuffer& grads = ctx.weights.grads;
        const Ptr dw = weights ? grads.at(w.weight) : Ptr();
        const Ptr db = weights && w.bias != kNoParam ? grads.at(w.bias) : Ptr();
        const ConstPtr weight =
            dx ? ConstPtr(params.at(w.weight)) : ConstPtr(nullptr, params.dtype());
        ctx.ops.matmul_backward(dx, dw, db, dy, x, weight, rows, w.in, w.out);
    }
};

}  // namespace

const GemmPolicy& dense_gemm() {
    static const DenseGemm gemm;
    return gemm;
}

}  // namespace trident::model
