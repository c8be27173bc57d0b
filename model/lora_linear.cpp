// A linear wrapped by its adapters (see lora_linear.h).
#include "model/lora_linear.h"

namespace trident::model {

using kernels::ConstPtr;
using kernels::Ptr;

LoraLinear::LoraLinear(const LinearSpec& spec, const Dims& d, SetSpec& set, ScratchSpec& scratch)
    : Linear(spec, d, set, scratch) {
    const bool column = spec.split == LinearSplit::column;
    // A row-split linear's input is split by columns: this rank's start at in·rank.
    const int whole_in = column ? spec.in : spec.in * d.M;
    const int first_column = column ? 0 : spec.in * d.tensor_rank;
    for (const LoraSpec& adapter : spec.lora)
        adapters_.emplace_back(adapter, d, spec.in, spec.out, whole_in, first_column, !column, set,
                               scratch);
}

void LoraLinear::add_output(PartContext& ctx, const Pass& pass, ConstPtr x, Ptr y) const {
    for (const LoraAdapter& adapter : adapters_) {
        adapter.down(ctx, pass, x);
        adapter.up(ctx, pass, y);
    }
}

void LoraLinear::add_input_grad(PartContext& ctx, const Pass& pass, ConstPtr x, ConstPtr dy, Ptr dx,
                                bool weights) const {
    for (const LoraAdapter& adapter : adapters_)
        adapter.backward(ctx, pass, x, dy, dx, true, weights);
}

void LoraLinear::add_weight_grads(PartContext& ctx, const Pass& pass, ConstPtr x,
                                  ConstPtr dy) const {
    for (const LoraAdapter& adapter : adapters_)
        adapter.backward(ctx, pass, x, dy, Ptr(), false, true);
}

void LoraLinear::finish_grads(PartContext& ctx) const {
    for (const LoraAdapter& adapter : adapters_) adapter.finish_grads(ctx);
}

void LoraLinear::rebuild(PartContext& ctx, const Pass& pass, ConstPtr x) const {
    for (const LoraAdapter& adapter : adapters_) adapter.down(ctx, pass, x);
}

}  // namespace trident::model
