// fp16 rounding and host-side conversion between element types (see dtype.h).
#include "kernels/dtype.h"

#include <cstring>

#include "kernels/error.h"

namespace trident::kernels {

const char* name_of(DType t) {
    switch (t) {
        case DType::f32:
            return "fp32";
        case DType::bf16:
            return "bf16";
        case DType::f16:
            return "fp16";
        case DType::f64:
            return "fp64";
        case DType::i64:
            return "i64";
        case DType::i32:
            return "i32";
        case DType::i16:
            return "i16";
        case DType::i8:
            return "i8";
        case DType::u64:
            return "u64";
        case DType::u32:
            return "u32";
        case DType::u16:
            return "u16";
        case DType::u8:
            return "u8";
        case DType::boolean:
            return "bool";
        case DType::f8_e4m3:
            return "f8_e4m3";
        case DType::f8_e5m2:
            return "f8_e5m2";
    }
    return "?";
}

namespace {

[[noreturn]] void not_a_compute_type(DType t, const char* what) {
    throw Error(std::string("internal: ") + what + " of " + name_of(t) +
                " elements; only fp32, bf16 and fp16 convert");
}

}  // namespace

float* Ptr::f32() const {
    if (dtype != DType::f32)
        throw Error(std::string("internal: an fp32 buffer expected, got ") + name_of(dtype));
    return static_cast<float*>(data);
}

const float* ConstPtr::f32() const {
    if (dtype != DType::f32)
        throw Error(std::string("internal: an fp32 buffer expected, got ") + name_of(dtype));
    return static_cast<const float*>(data);
}

uint16_t to_f16(float x) {
    const uint32_t bits = std::bit_cast<uint32_t>(x);
    const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
    const uint32_t magnitude = bits & 0x7FFFFFFFu;
    if (magnitude > 0x7F800000u) return sign | 0x7E00u;   // NaN, quiet
    if (magnitude >= 0x477FF000u) return sign | 0x7C00u;  // rounds past 65504: inf
    if (magnitude < 0x38800000u) {
        // Below 2^-14: a subnormal, m·2^-24 with m = round(|x|·2^24). Adding 0.5 (2^-1) makes
        // the FPU round |x| to a multiple of 2^-24, ties to even, in its low mantissa bits.
        const float shifted = std::bit_cast<float>(magnitude) + 0.5f;
        return sign | static_cast<uint16_t>(std::bit_cast<uint32_t>(shifted) - 0x3F000000u);
    }
    // Normal: rebias the exponent (127 -> 15) and keep 10 of 23 mantissa bits, rounding the
    // 13 dropped ones to nearest even; a carry moves into the exponent, as it should.
    const uint32_t odd = (magnitude >> 13) & 1u;
    const uint32_t rounded = magnitude - (112u << 23) + 0xFFFu + odd;
    return sign | static_cast<uint16_t>(rounded >> 13);
}

float from_f16(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exponent = (h >> 10) & 0x1Fu;
    const uint32_t mantissa = h & 0x3FFu;
    if (exponent == 0) {  // zero or subnormal: mantissa·2^-24, exact in fp32
        const float value = static_cast<float>(mantissa) * 0x1p-24f;
        return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(value));
    }
    if (exponent == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
    return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

void widen(float* out, ConstPtr in, std::size_t count) {
    const auto* h = static_cast<const uint16_t*>(in.data);
    switch (in.dtype) {
        case DType::f32:
            if (count) std::memmove(out, in.data, count * sizeof(float));
            return;
        case DType::bf16:
            for (std::size_t i = 0; i < count; ++i) out[i] = from_bf16(h[i]);
            return;
        case DType::f16:
            for (std::size_t i = 0; i < count; ++i) out[i] = from_f16(h[i]);
            return;
        default:
            not_a_compute_type(in.dtype, "widening");
    }
}

void narrow(Ptr out, const float* in, std::size_t count) {
    auto* h = static_cast<uint16_t*>(out.data);
    switch (out.dtype) {
        case DType::f32:
            if (count) std::memmove(out.data, in, count * sizeof(float));
            return;
        case DType::bf16:
            for (std::size_t i = 0; i < count; ++i) h[i] = to_bf16(in[i]);
            return;
        case DType::f16:
            for (std::size_t i = 0; i < count; ++i) h[i] = to_f16(in[i]);
            return;
        default:
            not_a_compute_type(out.dtype, "narrowing");
    }
}

}  // namespace trident::kernels
