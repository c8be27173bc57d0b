// The CPU backend's fp32 views of typed buffers (kernels/fp32_views.h has what they do):
// scratch arrays on the host, kept by the backend between ops so that a step allocates none
// once the first has run, and conversions split over the threads when they are large.
#pragma once

#include <cstddef>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/fp32_views.h"

namespace trident::kernels::cpu {

// The Storage of kernels::Fp32Views on the host: view i of an op uses array i of `pool`.
class HostScratch {
public:
    HostScratch(std::vector<std::vector<float>>& pool) : pool_(&pool) {}  // NOLINT: implicit

    float* acquire(std::size_t index, std::size_t count);
    void release(std::size_t, float*) {}
    void widen(float* scratch, ConstPtr from, std::size_t count);
    void narrow(Ptr to, const float* scratch, std::size_t count);

private:
    std::vector<std::vector<float>>* pool_;
};

// Constructed from the backend's pool: cpu::Fp32Views v(pool).
using Fp32Views = kernels::Fp32Views<HostScratch>;

}  // namespace trident::kernels::cpu
