// UploadStaging: host-to-device copies that return as soon as the host memory may be reused,
// without waiting for the device (Ops::upload on the GPU: the token ids of every microbatch).
//
// CUDA promises that a copy from pageable memory has read it at return only when the copy is
// synchronous, so a plain upload waits for all the compute queued before it. Here the bytes go
// first into one of a few page-locked slots (a memcpy on the host), and the slot's copy to the
// device is queued on the stream, after the work queued before it and before the work queued
// after it. A slot is written again only once its previous copy has happened (an event per
// slot): the host waits only when it runs more than kSlots uploads ahead of the device. A
// large upload (the weights at start-up) goes through the slots in pieces, so the page-locked
// memory stays kSlots * kSlotBytes.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>

namespace trident::kernels::cuda {

class UploadStaging {
public:
    explicit UploadStaging(cudaStream_t stream) : stream_(stream) {}
    ~UploadStaging();
    UploadStaging(const UploadStaging&) = delete;
    UploadStaging& operator=(const UploadStaging&) = delete;

    // `bytes` from `host` to `device`, queued on the stream; `host` may be reused on return.
    void upload(void* device, const void* host, std::size_t bytes);

    static constexpr int kSlots = 8;
    static constexpr std::size_t kSlotBytes = std::size_t{2} << 20;

private:
    struct Slot {
        void* host = nullptr;  // kSlotBytes, page-locked; allocated on first use
        cudaEvent_t copied = nullptr;
    };

    cudaStream_t stream_;
    std::array<Slot, kSlots> slots_{};
    int next_ = 0;
};

}  // namespace trident::kernels::cuda
