// Element types known only at run time, for host and device code alike (elements.cuh has the
// device-side loads and stores): kernels whose inner loops work on float copies convert only on
// the way in and out, and parameter gradients may be fp32 while activations are 16-bit
// (training.fp32_grad_accumulation), so one instantiation serves every combination.
#pragma once

namespace trident::kernels::cuda {

enum class ElementType : int { f32, bf16, f16 };

// A device pointer with its element type.
struct AnyPtr {
    void* data = nullptr;
    ElementType type = ElementType::f32;
};

}  // namespace trident::kernels::cuda
