// This rank's optimizer state in host memory (optimizer.offload: host; ZeRO-Offload, Ren et
// al., arXiv 2101.06840): the fp32 master weights and the optimizer's state arrays of what it
// owns (AdamW: 12 bytes per owned parameter), in one buffer from Ops::allocate_host (page-locked on
// a GPU, so the device copies to and from it directly; plain memory on the CPU backend). It is laid
// out as the nvme store's file (optim/offload_store.h), chunk after chunk of its arrays, and stream
// visits the chunks in place: nothing is copied, nothing can fail.
#pragma once

#include <cstddef>

#include "kernels/device_buffer.h"
#include "kernels/ops.h"
#include "optim/state_store.h"

namespace trident::optim {

class HostStore final : public StateStore {
public:
    // Zeros (the state before the first step) for `elements` parameters, `arrays` floats each,
    // visited in chunks of `chunk`.
    HostStore(kernels::Ops& ops, std::size_t elements, std::size_t arrays, std::size_t chunk);

    void stream(Pass pass, const std::function<void(const Chunk&)>& visit) override;
    std::size_t chunk() const override { return chunk_; }
    std::size_t bytes() const { return state_.bytes(); }  // host memory the state takes

private:
    std::size_t elements_, arrays_, chunk_;
    kernels::HostBuffer state_;  // (arrays · elements) fp32, chunk by chunk
};

}  // namespace trident::optim
