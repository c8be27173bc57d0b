// Host scratch for the CPU backend's fp32 views (see fp32_views.h).
#include "kernels/cpu/fp32_views.h"

#include <omp.h>

#include <algorithm>

namespace trident::kernels::cpu {

namespace {

// Conversions are a pass over memory; large ones are split over the threads. fn(begin, end)
// converts elements [begin, end).
constexpr std::size_t kParallelFrom = std::size_t{1} << 16;

template <typename Fn>
void in_pieces(std::size_t count, Fn fn) {
    const std::size_t threads =
        count < kParallelFrom ? 1 : static_cast<std::size_t>(omp_get_max_threads());
    const std::size_t piece = (count + threads - 1) / threads;
#pragma omp parallel for if (threads > 1)
    for (std::size_t t = 0; t < threads; ++t) {
        const std::size_t begin = std::min(count, t * piece);
        fn(begin, std::min(count, begin + piece));
    }
}

}  // namespace

float* HostScratch::acquire(std::size_t index, std::size_t count) {
    if (pool_->size() <= index) pool_->resize(index + 1);
    std::vector<float>& scratch = (*pool_)[index];
    if (scratch.size() < count) scratch.resize(count);
    return scratch.data();
}

void HostScratch::widen(float* scratch, ConstPtr from, std::size_t count) {
    in_pieces(count,
              [&](std::size_t b, std::size_t e) { kernels::widen(scratch + b, from + b, e - b); });
}

void HostScratch::narrow(Ptr to, const float* scratch, std::size_t count) {
    in_pieces(count,
              [&](std::size_t b, std::size_t e) { kernels::narrow(to + b, scratch + b, e - b); });
}

}  // namespace trident::kernels::cpu
