// Element types of buffers — device buffers, messages between ranks and tensors in files —
// typed pointers into them, and the rounding between fp32 and the two 16-bit formats.
//
// One vocabulary serves the whole program: the op set computes on the three floating types
// of parameters, activations and gradients (f32, bf16, f16); Comm also moves doubles,
// integers and bytes (control data: norms, flags, digests, sizes); the safetensors reader
// and writer name every type the format knows with the same enum.
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

// The first three are the op set's (and training.precision's, in this order); the rest are
// for communication and files. f8 and bool are known so that files holding them can be read.
enum class DType : uint8_t {
    f32,
    bf16,
    f16,
    f64,
    i64,
    i32,
    i16,
    i8,
    u64,
    u32,
    u16,
    u8,
    boolean,
    f8_e4m3,
    f8_e5m2
};

constexpr std::size_t size_of(DType t) {  // bytes per element
    switch (t) {
        case DType::f64:
        case DType::i64:
        case DType::u64:
            return 8;
        case DType::f32:
        case DType::i32:
        case DType::u32:
            return 4;
        case DType::bf16:
        case DType::f16:
        case DType::i16:
        case DType::u16:
            return 2;
        default:
            return 1;
    }
}
const char* name_of(DType t);  // "fp32", "bf16", "fp16", "fp64", "i64", ..., "bool", "f8_e4m3"
// Whether the op set computes on it: fp32 or one of the 16-bit floating types.
constexpr bool is_compute_type(DType t) {
    return t == DType::f32 || t == DType::bf16 || t == DType::f16;
}

// The element type of a C++ type a buffer may hold. uint16_t has none: it is the storage of
// bf16 and fp16 alike, so a pointer to one must say which (Ptr(p, DType::bf16)).
template <typename T>
struct ElementOf;
template <>
struct ElementOf<float> {
    static constexpr DType dtype = DType::f32;
};
template <>
struct ElementOf<double> {
    static constexpr DType dtype = DType::f64;
};
template <>
struct ElementOf<int64_t> {
    static constexpr DType dtype = DType::i64;
};
template <>
struct ElementOf<int32_t> {
    static constexpr DType dtype = DType::i32;
};
template <>
struct ElementOf<uint64_t> {
    static constexpr DType dtype = DType::u64;
};
template <>
struct ElementOf<uint32_t> {
    static constexpr DType dtype = DType::u32;
};
template <>
struct ElementOf<uint8_t> {
    static constexpr DType dtype = DType::u8;
};
template <typename T>
concept Element = requires {
    ElementOf<T>::dtype;
};

// A pointer into a buffer with the type of its elements; offsets count elements. A pointer to
// a C++ element type converts implicitly (a float* is an fp32 buffer, an int64_t* an i64 one).
struct Ptr {
    void* data = nullptr;
    DType dtype = DType::f32;

    Ptr() = default;
    Ptr(std::nullptr_t) {}  // NOLINT: implicit on purpose
    template <Element T>
    Ptr(T* p) : data(p), dtype(ElementOf<T>::dtype) {}  // NOLINT: implicit on purpose
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
    ConstPtr(std::nullptr_t) {}  // NOLINT: implicit on purpose
    template <Element T>
    ConstPtr(const T* p) : data(p), dtype(ElementOf<T>::dtype) {}  // NOLINT: implicit on purpose
    ConstPtr(Ptr p) : data(p.data), dtype(p.dtype) {}              // NOLINT
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

// Rounds x to the precision of `t` and back (fp32: x itself; `t` is a compute type).
inline float round_to(DType t, float x) {
    switch (t) {
        case DType::bf16:
            return from_bf16(to_bf16(x));
        case DType::f16:
            return from_f16(to_f16(x));
        default:
            break;
    }
    return x;
}

// Host-side conversion of `count` elements of a compute type: to fp32, and from fp32
// rounding as above; another type is an internal error.
void widen(float* out, ConstPtr in, std::size_t count);
void narrow(Ptr out, const float* in, std::size_t count);

}  // namespace trident::kernels
