// The process's record of device memory in use on other streams (see stream_uses.h).
#include "kernels/cuda/stream_uses.h"

#include <mutex>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/pending_uses.h"

namespace trident::kernels::cuda {

namespace {

struct Record {
    std::mutex mutex;
    PendingUses<SharedEvent> uses;
};

Record& record() {
    static Record r;
    return r;
}

// Whether the work before the event has run. An error (a fault in that work) counts as
// not happened: the compute stream then waits on the event, and the fault surfaces at the
// next call that waits for the device.
bool happened(const SharedEvent& event) {
    const cudaError_t status = cudaEventQuery(event.get());
    if (status == cudaSuccess) return true;
    if (status != cudaErrorNotReady) cudaGetLastError();
    return false;
}

}  // namespace

SharedEvent record_stream_use(cudaStream_t stream,
                              std::initializer_list<std::pair<const void*, std::size_t>> ranges) {
    cudaEvent_t raw = nullptr;
    TRIDENT_CUDA_CHECK(cudaEventCreateWithFlags(&raw, cudaEventDisableTiming));
    SharedEvent event(raw, [](cudaEvent_t e) { cudaEventDestroy(e); });
    TRIDENT_CUDA_CHECK(cudaEventRecord(raw, stream));
    Record& r = record();
    const std::lock_guard<std::mutex> lock(r.mutex);
    for (const auto& [data, bytes] : ranges) r.uses.add(data, bytes, event, happened);
    return event;
}

void await_stream_uses(const void* data, std::size_t bytes) {
    Record& r = record();
    const std::lock_guard<std::mutex> lock(r.mutex);
    if (r.uses.empty()) return;  // the common case: no collective under way
    // Called from the allocator's release, in destructors too: nothing here throws. Should
    // the stream not take the wait, the host waits instead; an error that stays is reported
    // by the next checked call.
    r.uses.before_reuse(data, bytes, happened, [](const SharedEvent& event) {
        if (cudaStreamWaitEvent(compute_stream(), event.get(), 0) == cudaSuccess) return;
        cudaGetLastError();
        cudaEventSynchronize(event.get());
    });
}

std::size_t pending_stream_uses() {
    Record& r = record();
    const std::lock_guard<std::mutex> lock(r.mutex);
    return r.uses.size();
}

}  // namespace trident::kernels::cuda
