// The parts of the trainable buffer this rank owns (data_parallel/data_parallel.h decides which),
// cut where the tensors they cover differ in what an update and the gradient norm ask of them:
// whether weight decay applies, whether this rank counts them in the norm (held once here, not
// a copy another rank speaks for: model/param_layout.h, held_elsewhere) and whether they train.
#pragma once

#include <cstddef>
#include <vector>

#include "data_parallel/data_parallel.h"
#include "model/param_layout.h"

namespace trident::optim {

// A maximal run of owned elements of tensors alike.
struct OwnedRange {
    std::size_t offset, count;  // in the buffer
    std::size_t state;          // where its state starts (the owned parts' state, in order)
    bool decay, counted, trains;
};

// In buffer order.
std::vector<OwnedRange> owned_ranges(const model::ParamLayout& layout,
                                     const std::vector<data_parallel::OwnedPart>& owned);

}  // namespace trident::optim
