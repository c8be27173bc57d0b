// Fp32 views of mixed-type arguments on the device (see fp32_staging.h).
#include "kernels/cuda/fp32_staging.h"

#include <algorithm>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_allocator.h"

namespace trident::kernels::cuda {

namespace {

void widen(float* out, const void* in, DType t, std::size_t count, cudaStream_t stream) {
    if (t == DType::bf16)
        convert(out, static_cast<const __nv_bfloat16*>(in), count, stream);
    else
        convert(out, static_cast<const __half*>(in), count, stream);
}

void narrow(void* out, DType t, const float* in, std::size_t count, cudaStream_t stream) {
    if (t == DType::bf16)
        convert(static_cast<__nv_bfloat16*>(out), in, count, stream);
    else
        convert(static_cast<__half*>(out), in, count, stream);
}

}  // namespace

Fp32Staging::~Fp32Staging() {
    for (const View& v : views_) allocator_.release(v.scratch);
}

float* Fp32Staging::view(const void* data, DType dtype, std::size_t count, bool read, bool write) {
    if (data == nullptr) return nullptr;
    if (dtype == DType::f32) return static_cast<float*>(const_cast<void*>(data));
    auto it =
        std::find_if(views_.begin(), views_.end(), [&](const View& v) { return v.data == data; });
    if (it == views_.end()) {
        views_.push_back(View{data, dtype, 0, nullptr, false, false});
        it = views_.end() - 1;
    }
    if (it->count < count) {
        // A larger view of the same buffer than asked before: start its scratch again.
        allocator_.release(it->scratch);
        it->scratch = static_cast<float*>(
            allocator_.allocate(std::max<std::size_t>(count, 1) * sizeof(float)));
        it->count = count;
        it->widened = false;
    }
    if (read && !it->widened) {
        widen(it->scratch, data, dtype, it->count, stream_);
        it->widened = true;
    }
    it->written = it->written || write;
    return it->scratch;
}

const float* Fp32Staging::in(ConstPtr p, std::size_t count) {
    return view(p.data, p.dtype, count, true, false);
}

float* Fp32Staging::out(Ptr p, std::size_t count) {
    return view(p.data, p.dtype, count, false, true);
}

float* Fp32Staging::inout(Ptr p, std::size_t count) {
    return view(p.data, p.dtype, count, true, true);
}

void Fp32Staging::commit() {
    for (View& v : views_) {
        if (v.written) narrow(const_cast<void*>(v.data), v.dtype, v.scratch, v.count, stream_);
        v.written = false;
    }
}

}  // namespace trident::kernels::cuda
