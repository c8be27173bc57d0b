// Device scratch for the GPU backend's fp32 views (see fp32_views.h).
#include "kernels/cuda/fp32_views.h"

#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/error.h"

namespace trident::kernels::cuda {

float* DeviceScratch::acquire(std::size_t, std::size_t count) {
    return static_cast<float*>(
        allocator_->allocate(std::max<std::size_t>(count, 1) * sizeof(float)));
}

void DeviceScratch::release(std::size_t, float* scratch) {
    allocator_->release(scratch);
}

// Only 16-bit buffers get a view (an fp32 one is used as it is).
void DeviceScratch::widen(float* scratch, ConstPtr from, std::size_t count) {
    switch (from.dtype) {
        case DType::bf16:
            return convert(scratch, static_cast<const __nv_bfloat16*>(from.data), count, stream_);
        case DType::f16:
            return convert(scratch, static_cast<const __half*>(from.data), count, stream_);
        default:
            throw Error(std::string("internal: widening ") + name_of(from.dtype) + " on the GPU");
    }
}

void DeviceScratch::narrow(Ptr to, const float* scratch, std::size_t count) {
    switch (to.dtype) {
        case DType::bf16:
            return convert(static_cast<__nv_bfloat16*>(to.data), scratch, count, stream_);
        case DType::f16:
            return convert(static_cast<__half*>(to.data), scratch, count, stream_);
        default:
            throw Error(std::string("internal: narrowing into ") + name_of(to.dtype) +
                        " on the GPU");
    }
}

}  // namespace trident::kernels::cuda
