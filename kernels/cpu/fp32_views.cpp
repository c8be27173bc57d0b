// Fp32 views of typed buffers for the CPU kernels (see fp32_views.h).
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

float* Fp32Views::view(const void* data, DType dtype, std::size_t count, bool read, bool write) {
    if (data == nullptr) return nullptr;
    if (dtype == DType::f32) return static_cast<float*>(const_cast<void*>(data));
    auto it =
        std::find_if(views_.begin(), views_.end(), [&](const View& v) { return v.data == data; });
    if (it == views_.end()) {
        const std::size_t slot = views_.size();
        if (pool_.size() <= slot) pool_.resize(slot + 1);
        views_.push_back(View{data, dtype, 0, slot, false, false});
        it = views_.end() - 1;
    }
    std::vector<float>& scratch = pool_[it->slot];
    if (scratch.size() < count) scratch.resize(count);
    if (read && (!it->widened || it->count < count)) {
        const ConstPtr source(data, dtype);
        float* target = scratch.data();
        in_pieces(count, [&](std::size_t b, std::size_t e) { widen(target + b, source + b, e - b); });
        it->widened = true;
    }
    it->count = std::max(it->count, count);
    it->written = it->written || write;
    return scratch.data();
}

const float* Fp32Views::in(ConstPtr p, std::size_t count) {
    return view(p.data, p.dtype, count, true, false);
}

float* Fp32Views::out(Ptr p, std::size_t count) {
    return view(p.data, p.dtype, count, false, true);
}

float* Fp32Views::inout(Ptr p, std::size_t count) {
    return view(p.data, p.dtype, count, true, true);
}

Fp32Views::~Fp32Views() {
    for (const View& v : views_) {
        if (!v.written) continue;
        const Ptr target(const_cast<void*>(v.data), v.dtype);
        const float* source = pool_[v.slot].data();
        in_pieces(v.count, [&](std::size_t b, std::size_t e) { narrow(target + b, source + b, e - b); });
    }
}

}  // namespace trident::kernels::cpu
