// The GPU backend's fp32 views of typed buffers (kernels/fp32_views.h has what they do): how
// it runs an op whose arguments mix element types in a way its kernels do not take directly
// (fp32 inputs into a bf16 output, say), at the cost of a conversion pass per 16-bit
// argument. The common cases (one type throughout; parameter gradients in fp32) never come
// here. Scratch comes from the caching allocator and conversions are kernels on the compute
// stream, so the scratch goes back once the op and its rounding are queued.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/dtype.h"
#include "kernels/fp32_views.h"

namespace trident::kernels::cuda {

class DeviceAllocator;

// The Storage of kernels::Fp32Views on the device.
class DeviceScratch {
public:
    DeviceScratch(DeviceAllocator& allocator, cudaStream_t stream)
        : allocator_(&allocator), stream_(stream) {}

    float* acquire(std::size_t index, std::size_t count);
    void release(std::size_t index, float* scratch);
    void widen(float* scratch, ConstPtr from, std::size_t count);
    void narrow(Ptr to, const float* scratch, std::size_t count);

private:
    DeviceAllocator* allocator_;
    cudaStream_t stream_;
};

using Fp32Views = kernels::Fp32Views<DeviceScratch>;

}  // namespace trident::kernels::cuda
