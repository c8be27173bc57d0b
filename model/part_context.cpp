// The model's shared scratch (see part_context.h).
#include "model/part_context.h"

namespace trident::model {

Scratch::Scratch(kernels::Ops& ops, const std::vector<BufferSpec>& spec) {
    buffers_.reserve(spec.size());
    for (const BufferSpec& b : spec) buffers_.emplace_back(ops, b.count, b.dtype);
}

}  // namespace trident::model
