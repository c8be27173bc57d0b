// Element types of device buffers, typed pointers into them, and the rounding between fp32
// and the two 16-bit formats.
//
// Mixed precision keeps parameters, activations and gradients in bf16 or fp16 while every op
// computes in fp32: it widens its 16-bit inputs (exactly) and rounds its outputs to nearest,
// ties to even — what a GPU's tensor cores and fp32-accumulating kernels do. Statistics
// (LayerNorm mean and rstd, the loss's row statistics) and the optimizer's state stay plain
// fp32 buffers (float*).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace trident::kernels {

enum class DType : uint8_t { f32, bf16, f16 };

constexpr std::size_t size_of(DType t) {
    return t == DType::f32 ? 4 : 2;
}
const char* name_of(DType t);  // "fp32", "bf16", "fp16"

// A pointer into a device buffer with the type of its elements; offsets count elements.
// A float* converts implicitly: an fp32 buffer is one.
struct Ptr {
    void* data = nullptr;
    DType dtype = DType::f32;

    Ptr() = default;
    Ptr(float* p) : data(p) {}  // NOLINT: implicit on purpose
    Ptr(void* p, DType t) : data(p), dtype(t) {}
    Ptr operator+(std::size_t elements) const {
        return {static_cast<char*>(data) + elements * size_of(dtype), dtype};
    }
    explicit operator bool() const { return data != nullptr; }
    // The fp32 buffer this points into; throws if it holds another type.
    float* f32() const;
};

// The same for data an op only reads.
struct ConstPtr {
    const void* data = nullptr;
    DType dtype = DType::f32;

    ConstPtr() = default;
    ConstPtr(const float* p) : data(p) {}              // NOLINT: implicit on purpose
    ConstPtr(Ptr p) : data(p.data), dtype(p.dtype) {}  // NOLINT
    ConstPtr(const void* p, DType t) : data(p), dtype(t) {}
    ConstPtr operator+(std::size_t elements) const {
        return {static_cast<const char*>(data) + elements * size_of(dtype), dtype};
    }
    explicit operator bool() const { return data != nullptr; }
    const float* f32() const;
};

// ---- rounding -------------------------------------------------------------------------------
// bf16 is the top half of an fp32; rounding adds just under half an ulp of the kept part plus
// the kept part's lowest bit (ties to even). NaN stays NaN (quiet), overflow becomes inf.
inline uint16_t to_bf16(float x) {
    const uint32_t bits = std::bit_cast<uint32_t>(x);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
    return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}
inline float from_bf16(uint16_t h) {
    return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

// IEEE binary16: 5 exponent bits (bias 15), 10 mantissa bits, subnormals below 2^-14,
// largest finite 65504. Round to nearest even, overflow to inf, NaN stays NaN.
uint16_t to_f16(float x);
float from_f16(uint16_t h);

// Rounds x to the precision of `t` and back (fp32: x itself).
inline float round_to(DType t, float x) {
    switch (t) {
        case DType::bf16:
            return from_bf16(to_bf16(x));
        case DType::f16:
            return from_f16(to_f16(x));
        case DType::f32:
            break;
    }
    return x;
}

// Host-side conversion of `count` elements: to fp32, and from fp32 rounding as above.
void widen(float* out, ConstPtr in, std::size_t count);
void narrow(Ptr out, const float* in, std::size_t count);

}  // namespace trident::kernels
