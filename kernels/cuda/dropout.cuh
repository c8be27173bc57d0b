// Dropout's keep decision on the device: the same pure function of (seed, index) as
// kernels::dropout_keep on the host (kernels/ops.h), so both backends drop the same elements.
#pragma once

#include <cstdint>

#include "kernels/random.h"

namespace trident::kernels::cuda {

__device__ __forceinline__ bool dropout_kept(uint64_t seed, uint64_t index, float drop_prob) {
    return uniform_float(seed, index) >= drop_prob;
}

}  // namespace trident::kernels::cuda
