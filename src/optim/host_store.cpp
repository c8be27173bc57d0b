// The optimizer state in host memory (see host_store.h).
#include "optim/host_store.h"

#include <algorithm>

namespace trident::optim {

HostStore::HostStore(kernels::Ops& ops, std::size_t elements, std::size_t chunk)
    : elements_(elements),
      chunk_(std::max<std::size_t>(1, std::min(chunk, elements))),
      state_(ops, 3 * elements * sizeof(float)) {}

// Every pass is the same visit: the memory is the state, read and written in place.
void HostStore::stream(Pass, const std::function<void(const Chunk&)>& visit) {
    float* const state = state_.as<float>();
    for (std::size_t first = 0; first < elements_; first += chunk_) {
        const std::size_t count = std::min(chunk_, elements_ - first);
        float* const base = state + 3 * first;
        visit(Chunk{first, count, base, base + count, base + 2 * count});
    }
}

}  // namespace trident::optim
