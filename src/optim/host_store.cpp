// The optimizer state in host memory (see host_store.h).
#include "optim/host_store.h"

#include <algorithm>
#include <string>

namespace trident::optim {

namespace {

// (elements · arrays) floats of host memory, page-locked on CUDA: an OffloadError where they
// cannot be had, so that every rank stops with the one that lacks them.
kernels::HostBuffer allocate(kernels::Ops& ops, std::size_t elements, std::size_t arrays) {
    try {
        return kernels::HostBuffer(ops, arrays * elements * sizeof(float));
    } catch (const Error& e) {
        throw OffloadError(std::string("optimizer.offload: host: this rank's optimizer state: ") +
                           e.what());
    }
}

}  // namespace

HostStore::HostStore(kernels::Ops& ops, std::size_t elements, std::size_t arrays, std::size_t chunk)
    : elements_(elements),
      arrays_(arrays),
      chunk_(std::max<std::size_t>(1, std::min(chunk, elements))),
      state_(allocate(ops, elements, arrays)) {}

// Every pass is the same visit: the memory is the state, read and written in place.
void HostStore::stream(Pass, const std::function<void(const Chunk&)>& visit) {
    float* const state = state_.as<float>();
    for (std::size_t first = 0; first < elements_; first += chunk_) {
        const std::size_t count = std::min(chunk_, elements_ - first);
        Chunk c{first, count, {}};
        for (std::size_t a = 0; a < arrays_; ++a) c.arrays[a] = state + arrays_ * first + a * count;
        visit(c);
    }
}

}  // namespace trident::optim
