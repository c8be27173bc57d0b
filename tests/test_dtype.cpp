// 16-bit rounding (kernels/dtype.h): bf16 and fp16 round to nearest, ties to even, with
// overflow to inf, NaN kept, and fp16's subnormals; checked on chosen values, exhaustively
// over every 16-bit pattern, and against the compiler's own _Float16 conversion.
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/random.h"

using namespace trident::kernels;

namespace {

float bits(uint32_t b) {
    return std::bit_cast<float>(b);
}

}  // namespace

TEST_CASE("bf16: round to nearest even, inf and NaN", "[dtype]") {
    CHECK(to_bf16(1.0f) == 0x3F80);
    CHECK(from_bf16(0x3F80) == 1.0f);
    // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
    CHECK(to_bf16(bits(0x3F808000)) == 0x3F80);
    // 1 + 3·2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up, to even.
    CHECK(to_bf16(bits(0x3F818000)) == 0x3F82);
    CHECK(to_bf16(bits(0x3F808001)) == 0x3F81);  // just above half: up
    CHECK(to_bf16(bits(0x3F807FFF)) == 0x3F80);  // just below: down
    CHECK(to_bf16(-2.5f) == 0xC020);
    CHECK(to_bf16(std::numeric_limits<float>::max()) == 0x7F80);  // rounds up into inf
    CHECK(to_bf16(std::numeric_limits<float>::infinity()) == 0x7F80);
    CHECK(std::isnan(from_bf16(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
    CHECK(std::isnan(from_bf16(to_bf16(bits(0x7F800001)))));  // a NaN that rounding would make inf
    // Every bf16 value survives the round trip.
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const float x = from_bf16(static_cast<uint16_t>(h));
        if (!std::isnan(x)) REQUIRE(to_bf16(x) == h);
    }
}

TEST_CASE("fp16: round to nearest even, subnormals, overflow, NaN", "[dtype]") {
    CHECK(to_f16(1.0f) == 0x3C00);
    CHECK(to_f16(65504.0f) == 0x7BFF);  // the largest finite
    CHECK(to_f16(65519.0f) == 0x7BFF);  // below the halfway point to 65536
    CHECK(to_f16(65520.0f) == 0x7C00);  // the halfway point: to even, which is inf
    CHECK(to_f16(-1e9f) == 0xFC00);
    CHECK(to_f16(0x1p-24f) == 0x0001);      // the smallest subnormal
    CHECK(to_f16(0x1p-25f) == 0x0000);      // half of it: a tie, to even (zero)
    CHECK(to_f16(0x1.8p-24f) == 0x0002);    // 1.5 of it: a tie, to even (2)
    CHECK(to_f16(0x1p-14f) == 0x0400);      // the smallest normal
    CHECK(to_f16(0x1.ffcp-15f) == 0x0400);  // 1023.5 subnormal steps: a tie, up into the normals
    CHECK(from_f16(0x0001) == 0x1p-24f);
    CHECK(std::isinf(from_f16(0x7C00)));
    CHECK(std::isnan(from_f16(to_f16(std::numeric_limits<float>::quiet_NaN()))));
    CHECK(to_f16(-0.0f) == 0x8000);
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const float x = from_f16(static_cast<uint16_t>(h));
        if (!std::isnan(x)) REQUIRE(to_f16(x) == h);
    }
}

#if defined(__FLT16_MAX__)
TEST_CASE("fp16: the same bits as the compiler's _Float16 on random floats", "[dtype]") {
    std::size_t wrong = 0;
    for (uint64_t i = 0; i < 2000000; ++i) {
        // Random bit patterns over the range fp16 covers, and beyond it.
        const uint32_t b = static_cast<uint32_t>(hash64(7, i)) % 0x50000000u + 0x30000000u;
        const float x = std::bit_cast<float>(b | (i % 2 ? 0x80000000u : 0u));
        if (std::isnan(x)) continue;  // NaN payloads may differ; NaN-ness is checked above
        const _Float16 reference = static_cast<_Float16>(x);
        wrong += to_f16(x) != std::bit_cast<uint16_t>(reference);
    }
    CHECK(wrong == 0);
}
#endif

TEST_CASE("typed pointers: offsets count elements and host conversion rounds", "[dtype]") {
    std::vector<uint16_t> storage(8);
    const Ptr p(storage.data(), DType::bf16);
    CHECK((p + 3).data == storage.data() + 3);
    std::vector<float> f(8);
    CHECK((Ptr(f.data()) + 3).data == f.data() + 3);
    CHECK_THROWS(p.f32());
    const float in[3] = {1.0f, 1.00390625f, -3.0e38f};  // 1 + 2^-8: a tie, to 1
    narrow(p, in, 3);
    float out[3];
    widen(out, p, 3);
    CHECK(out[0] == 1.0f);
    CHECK(out[1] == 1.0f);
    CHECK(out[2] == from_bf16(to_bf16(-3.0e38f)));
    CHECK(round_to(DType::f16, 1e6f) == std::numeric_limits<float>::infinity());
    CHECK(round_to(DType::f32, 1e6f) == 1e6f);
}
