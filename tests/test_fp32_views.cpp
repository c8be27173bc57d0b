// The fp32 views both backends run their kernels through (kernels/fp32_views.h), over a
// Storage that records what it is asked: fp32 buffers pass through, 16-bit ones are widened
// once and rounded back once per commit(), aliases share one scratch array, and what the
// views cannot do is an error.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/error.h"
#include "kernels/fp32_views.h"

using namespace trident::kernels;

namespace {

// Host scratch that counts conversions: widen and narrow convert as the host does.
struct Log {
    std::vector<std::vector<float>> scratch;
    int acquired = 0, released = 0, widened = 0, narrowed = 0;
};

struct CountingStorage {
    Log* log;
    float* acquire(std::size_t index, std::size_t count) {
        ++log->acquired;
        if (log->scratch.size() <= index) log->scratch.resize(index + 1);
        log->scratch[index].assign(count, -1.0f);
        return log->scratch[index].data();
    }
    void release(std::size_t, float*) { ++log->released; }
    void widen(float* scratch, ConstPtr from, std::size_t count) {
        ++log->widened;
        trident::kernels::widen(scratch, from, count);
    }
    void narrow(Ptr to, const float* scratch, std::size_t count) {
        ++log->narrowed;
        trident::kernels::narrow(to, scratch, count);
    }
};

using Views = Fp32Views<CountingStorage>;

}  // namespace

TEST_CASE("fp32 views: fp32 passes through, 16-bit is widened, then rounded back on commit",
          "[fp32-views]") {
    Log log;
    std::vector<float> plain = {1.0f, 2.0f, 3.0f};
    std::vector<uint16_t> half(3);
    narrow(Ptr(half.data(), DType::bf16), plain.data(), 3);
    {
        Views v(CountingStorage{&log});
        REQUIRE(v.in(ConstPtr(plain.data()), 3) == plain.data());
        REQUIRE(v.in(ConstPtr(), 3) == nullptr);
        float* x = v.inout(Ptr(half.data(), DType::bf16), 3);
        REQUIRE(x != static_cast<void*>(half.data()));
        REQUIRE(std::vector<float>(x, x + 3) == plain);  // widened exactly
        for (int i = 0; i < 3; ++i) x[i] += 0.5f;
        REQUIRE(log.narrowed == 0);  // nothing rounded back before commit
        v.commit();
        v.commit();  // a second commit rounds nothing again
    }
    REQUIRE(log.acquired == 1);
    REQUIRE(log.released == 1);
    REQUIRE(log.widened == 1);
    REQUIRE(log.narrowed == 1);
    std::vector<float> back(3);
    widen(back.data(), ConstPtr(half.data(), DType::bf16), 3);
    REQUIRE(back == std::vector<float>{1.5f, 2.5f, 3.5f});
}

TEST_CASE("fp32 views: an output is not widened, aliases share one scratch array", "[fp32-views]") {
    Log log;
    std::vector<uint16_t> buffer(4, 0x3F80);  // bf16 ones
    {
        Views v(CountingStorage{&log});
        float* out = v.out(Ptr(buffer.data(), DType::bf16), 4);
        REQUIRE(log.widened == 0);
        // The same buffer as an input (in place): its values are read in now, into the same
        // scratch.
        const float* in = v.in(ConstPtr(buffer.data(), DType::bf16), 4);
        REQUIRE(in == out);
        REQUIRE(log.widened == 1);
        REQUIRE(in[0] == 1.0f);
        out[0] = 2.0f;
        v.commit();
    }
    REQUIRE(log.acquired == 1);
    REQUIRE(log.narrowed == 1);
    REQUIRE(buffer[0] == to_bf16(2.0f));
}

TEST_CASE("fp32 views: what they cannot do is an error", "[fp32-views]") {
    Log log;
    std::vector<uint16_t> buffer(8);
    Views v(CountingStorage{&log});
    v.in(ConstPtr(buffer.data(), DType::f16), 4);
    // The same buffer asked for with a larger extent would leave the scratch short.
    REQUIRE_THROWS_AS(v.in(ConstPtr(buffer.data(), DType::f16), 8), trident::Error);
    // An element type that is not a float type.
    REQUIRE_THROWS_AS(v.in(ConstPtr(buffer.data(), static_cast<DType>(200)), 4), trident::Error);
}
