// Where a buffer handed to a communicator lives. The trainer passes host buffers too (a loss
// as a float pair, a gathered checkpoint) to the same Comm that moves device buffers, so the
// GPU communicators ask for each pointer and send host buffers straight through MPI.
#pragma once

#include <cuda_runtime.h>

namespace trident::parallel {

// Whether `p` is device (or managed) memory; host memory, registered or not, is not.
inline bool on_device(const void* p) {
    if (p == nullptr) return false;
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
        cudaGetLastError();  // an unknown pointer is host memory; clear the error
        return false;
    }
    return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

}  // namespace trident::parallel
