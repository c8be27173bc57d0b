// The op set's host transfers with conversion, and a sum of squares read back at once, shared
// by every backend (see ops.h).
#include "kernels/ops.h"

#include <string>
#include <vector>

#include "kernels/error.h"

namespace trident::kernels {

void Ops::copy_to_host(float* host, ConstPtr device, std::size_t count) {
    if (device.dtype == DType::f32) {
        download(host, device.data, count * sizeof(float));
        return;
    }
    std::vector<uint16_t> staged(count);
    download(staged.data(), device.data, count * sizeof(uint16_t));
    widen(host, ConstPtr(staged.data(), device.dtype), count);
}

void Ops::copy_from_host(Ptr device, const float* host, std::size_t count) {
    if (device.dtype == DType::f32) {
        upload(device.data, host, count * sizeof(float));
        return;
    }
    std::vector<uint16_t> staged(count);
    narrow(Ptr(staged.data(), device.dtype), host, count);
    upload(device.data, staged.data(), count * sizeof(uint16_t));
}

double Ops::sum_of_squares(ConstPtr x, std::size_t count) {
    const Ptr total = allocate(1, DType::f64);  // zero-filled
    add_sum_of_squares(static_cast<double*>(total.data), x, count);
    double sum = 0.0;
    download(&sum, total.data, sizeof(sum));
    release(total.data);
    return sum;
}

namespace {

[[noreturn]] void missing(const Ops& ops, const char* op) {
    throw Error(std::string("the ") + ops.name() + " backend has no " + op +
                " kernel (model.arch: llama runs on the CPU backend)");
}

}  // namespace

void Ops::cached_attention_forward(Ptr, Ptr, Ptr, ConstPtr, int, int, int, int, int) {
    missing(*this, "cached_attention_forward");
}
void Ops::rmsnorm_forward(Ptr, float*, ConstPtr, ConstPtr, int, int, float) {
    missing(*this, "rmsnorm_forward");
}
void Ops::rmsnorm_backward(Ptr, Ptr, ConstPtr, ConstPtr, ConstPtr, const float*, int, int) {
    missing(*this, "rmsnorm_backward");
}
void Ops::rotary_qkv_forward(Ptr, ConstPtr, int, int, int, int, int, float, const int32_t*) {
    missing(*this, "rotary_qkv_forward");
}
void Ops::rotary_qkv_backward(Ptr, ConstPtr, int, int, int, int, int, float, const int32_t*) {
    missing(*this, "rotary_qkv_backward");
}
void Ops::swiglu_forward(Ptr, ConstPtr, int, int) {
    missing(*this, "swiglu_forward");
}
void Ops::swiglu_backward(Ptr, ConstPtr, ConstPtr, int, int) {
    missing(*this, "swiglu_backward");
}

}  // namespace trident::kernels
