// Uploads through page-locked slots (see upload_staging.h).
#include "kernels/cuda/upload_staging.h"

#include <algorithm>
#include <cstring>

#include "kernels/cuda/cuda_check.h"
// The host's waits for the device are marked for the stall watchdog, as in cuda_ops.cpp.
#include "kernels/host_wait.h"

namespace trident::kernels::cuda {

UploadStaging::~UploadStaging() {
    // Nothing may throw here; a failure (the driver shutting down) leaves the memory to exit.
    for (Slot& slot : slots_) {
        if (!slot.host) continue;
        if (cudaEventSynchronize(slot.copied) == cudaSuccess) cudaFreeHost(slot.host);
        cudaEventDestroy(slot.copied);
    }
}

void UploadStaging::upload(void* device, const void* host, std::size_t bytes) {
    for (std::size_t done = 0; done < bytes;) {
        const std::size_t piece = std::min(kSlotBytes, bytes - done);
        Slot& slot = slots_[static_cast<std::size_t>(next_)];
        next_ = (next_ + 1) % kSlots;
        if (!slot.host) {
            TRIDENT_CUDA_CHECK(cudaHostAlloc(&slot.host, kSlotBytes, cudaHostAllocDefault));
            TRIDENT_CUDA_CHECK(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
        } else if (cudaEventQuery(slot.copied) != cudaSuccess) {
            // The slot's last copy is still queued: the host is kSlots uploads ahead.
            const HostWait wait;
            TRIDENT_CUDA_CHECK(cudaEventSynchronize(slot.copied));
        }
        std::memcpy(slot.host, static_cast<const char*>(host) + done, piece);
        TRIDENT_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(device) + done, slot.host, piece,
                                           cudaMemcpyHostToDevice, stream_));
        TRIDENT_CUDA_CHECK(cudaEventRecord(slot.copied, stream_));
        done += piece;
    }
}

}  // namespace trident::kernels::cuda
