// Element types of device buffers as kernels see them: fp32, bf16 (__nv_bfloat16) and fp16
// (__half), read widened to float and written rounded to nearest, ties to even (kernels/dtype.h
// rounds the same way on the host). Every kernel computes in float whatever it stores.
//
// Pack<T> is 16 bytes of elements (4 floats or 8 halves): the widest load a thread issues in
// one instruction, which memory-bound kernels use when their pointers allow.
//
// Where an element type is known only at run time (a parameter gradient in fp32 beside 16-bit
// activations, training.fp32_grad_accumulation), kernels take kernels::DType by value and a
// Ptr (kernels/dtype.h), and convert per access.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/dtype.h"
#include "kernels/error.h"

namespace trident::kernels::cuda {

__device__ __forceinline__ float to_float(float x) {
    return x;
}
__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
    return __bfloat162float(x);
}
__device__ __forceinline__ float to_float(__half x) {
    return __half2float(x);
}

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
    return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
    return __float2half_rn(x);
}

template <typename T>
inline constexpr int kPack = 16 / sizeof(T);

template <typename T>
struct alignas(16) Pack {
    T v[kPack<T>];
};

template <typename T>
__device__ __forceinline__ Pack<T> load_pack(const T* p) {
    return *reinterpret_cast<const Pack<T>*>(p);
}
template <typename T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T>& x) {
    *reinterpret_cast<Pack<T>*>(p) = x;
}

// Loads and stores through an element type known at run time: a switch per access, which
// costs nothing measurable where the inner loops work on float copies.
template <typename E>
constexpr DType dtype_of() {
    if constexpr (std::is_same_v<E, float>)
        return DType::f32;
    else if constexpr (std::is_same_v<E, __nv_bfloat16>)
        return DType::bf16;
    else
        return DType::f16;
}

// The host's check before a launch that passes a run-time type: the kernels here compute on
// the float types alone, and the device switches below stop the kernel on any other.
inline void require_float_elements(DType t, const char* what) {
    switch (t) {
        case DType::f32:
        case DType::bf16:
        case DType::f16:
            return;
        default:
            throw Error(std::string("internal: ") + what + " of element type " +
                        std::to_string(static_cast<int>(t)) + ", not a float type");
    }
}

__device__ __forceinline__ float load_as_float(const void* p, DType t, std::size_t i) {
    switch (t) {
        case DType::f32:
            return static_cast<const float*>(p)[i];
        case DType::bf16:
            return to_float(static_cast<const __nv_bfloat16*>(p)[i]);
        case DType::f16:
            return to_float(static_cast<const __half*>(p)[i]);
        default:
            __trap();  // refused on the host (require_float_elements)
    }
    return 0.0f;
}

__device__ __forceinline__ void store_from_float(void* p, DType t, std::size_t i, float x) {
    switch (t) {
        case DType::f32:
            static_cast<float*>(p)[i] = x;
            break;
        case DType::bf16:
            static_cast<__nv_bfloat16*>(p)[i] = from_float<__nv_bfloat16>(x);
            break;
        case DType::f16:
            static_cast<__half*>(p)[i] = from_float<__half>(x);
            break;
        default:
            __trap();  // refused on the host (require_float_elements)
    }
}

// Whether a pointer may be read and written in whole packs.
inline bool pack_aligned(const void* p) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Warp and block reductions in a fixed order (a butterfly), so results repeat bit for bit.
template <typename V>
__device__ __forceinline__ V warp_sum(V x) {
    for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

// Sum over a block of at most 1024 threads (blockDim.x a multiple of 32); every thread gets
// the total. `shared` holds 32 values.
template <typename V>
__device__ V block_sum(V x, V* shared) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    x = warp_sum(x);
    __syncthreads();  // `shared` may still be read by a previous call
    if (lane == 0) shared[warp] = x;
    __syncthreads();
    x = lane < warps ? shared[lane] : V(0);
    return warp_sum(x);
}

}  // namespace trident::kernels::cuda
