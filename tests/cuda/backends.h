// What the GPU tests share: the CPU and CUDA backends side by side, buffers holding the same
// random values on both, and their comparison by relative error.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "kernels/random.h"

namespace gpu_test {

using trident::kernels::ConstPtr;
using trident::kernels::DType;
using trident::kernels::Ops;
using trident::kernels::Ptr;

// Tolerances of the comparison ||gpu - cpu|| / ||cpu||: fp32 results differ in the order of
// their additions only; 16-bit ones may differ by an ulp of their type where the fp32 values
// straddle a rounding, and where a kernel rounds an intermediate to the type (cuDNN's
// probabilities): a few units of the type's rounding, 2^-8 for bf16 and 2^-11 for fp16.
inline double tolerance(DType t) {
    switch (t) {
        case DType::f32:
            return 1e-5;
        case DType::bf16:
            return 1e-2;
        case DType::f16:
            return 2e-3;
        default:
            FAIL("no tolerance for element type " << static_cast<int>(t));
    }
    return 0.0;
}

// Tolerance of a comparison in which one side is cuDNN's fused attention: its kernels round
// one intermediate to the 16-bit type before each second product, where the flash kernels and
// the CPU's backward keep fp32: the probabilities P before O = P V and dV = P^T dO, and dS
// before dK = dS^T Q and dQ = dS K. With the two outputs' own roundings that is up to three
// half-ulps of the type per element (bf16 1.2e-2, fp16 1.5e-3), which twice the type's
// tolerance covers; fp32 never runs on cuDNN.
inline double attention_tolerance(DType t) {
    return t == DType::f32 ? tolerance(t) : 2 * tolerance(t);
}

inline const char* name(DType t) {
    return trident::kernels::name_of(t);
}

struct Backends {
    std::unique_ptr<Ops> cpu = trident::kernels::make_cpu_ops(1);
    // True fp32 products: the GPU is checked against the CPU's.
    std::unique_ptr<Ops> gpu = trident::kernels::make_cuda_ops(false);
};

// One tensor on both backends with the same contents.
struct Pair {
    Backends* b;
    std::size_t count;
    DType dtype;
    Ptr cpu, gpu;

    Pair(Backends& backends, std::size_t n, DType t) : b(&backends), count(n), dtype(t) {
        cpu = b->cpu->allocate(n, t);
        gpu = b->gpu->allocate(n, t);
    }
    ~Pair() {
        b->cpu->release(cpu.data);
        b->gpu->release(gpu.data);
    }
    Pair(const Pair&) = delete;
    Pair& operator=(const Pair&) = delete;

    // normal(0, scale) values (+ offset), rounded to the type, on both backends.
    Pair& fill(uint64_t seed, float scale = 1.0f, float offset = 0.0f) {
        std::vector<float> values(count);
        for (std::size_t i = 0; i < count; ++i)
            values[i] = static_cast<float>(trident::kernels::normal(seed, i)) * scale + offset;
        set(values);
        return *this;
    }
    void set(const std::vector<float>& values) {
        b->cpu->copy_from_host(cpu, values.data(), count);
        b->gpu->copy_from_host(gpu, values.data(), count);
    }
    std::vector<float> on_cpu(std::size_t n = 0) const { return host(*b->cpu, cpu, n ? n : count); }
    std::vector<float> on_gpu(std::size_t n = 0) const { return host(*b->gpu, gpu, n ? n : count); }

    static std::vector<float> host(Ops& ops, ConstPtr p, std::size_t n) {
        std::vector<float> values(n);
        ops.copy_to_host(values.data(), p, n);
        return values;
    }
};

// ||a - b|| / ||b||; NaN anywhere gives NaN, which fails every check. A reference of zeros
// gives infinity: it says nothing (an output never written compares equal to it), so a test
// must compare something that is not all zero.
inline double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
        norm += static_cast<double>(b[i]) * b[i];
    }
    if (norm == 0) return std::numeric_limits<double>::infinity();
    return std::sqrt(diff / norm);
}

// gpu against cpu within `limit` relative error.
inline void require_within(const std::vector<float>& gpu, const std::vector<float>& cpu,
                           double limit, const std::string& what) {
    const double error = relative_error(gpu, cpu);
    // One line per comparison, passed or not: scripts/gpu_verify.sh keeps each op's worst.
    std::printf("compared: %s: relative error %.3e (at most %.1e)\n", what.c_str(), error, limit);
    INFO(what << ": relative error " << error << " (at most " << limit << ")");
    REQUIRE(error <= limit);
}

// The GPU's values of `p` match the CPU's within the tolerance of `t` (the first n elements).
inline void require_close(const Pair& p, DType t, const std::string& what, std::size_t n = 0) {
    require_within(p.on_gpu(n), p.on_cpu(n), tolerance(t), what + " (" + name(t) + ")");
}

inline void require_close(const std::vector<float>& gpu, const std::vector<float>& cpu, DType t,
                          const std::string& what) {
    require_within(gpu, cpu, tolerance(t), what + " (" + name(t) + ")");
}

// got == want element for element; a failure names the first element that differs.
inline void require_equal(const std::vector<int32_t>& got, const std::vector<int32_t>& want,
                          const std::string& what) {
    REQUIRE(got.size() == want.size());
    std::size_t i = 0;
    while (i < got.size() && got[i] == want[i]) ++i;
    INFO(what << ": element " << i << " of " << got.size() << " differs");
    REQUIRE(i == got.size());
}

inline std::vector<int32_t> random_tokens(std::size_t n, int vocab, uint64_t seed) {
    std::vector<int32_t> tokens(n);
    for (std::size_t i = 0; i < n; ++i)
        tokens[i] =
            static_cast<int32_t>(trident::kernels::hash64(seed, i) % static_cast<uint64_t>(vocab));
    return tokens;
}

// int32 token ids in a float-sized buffer on each backend, as the model keeps them.
struct Tokens {
    Backends* b;
    Ptr cpu, gpu;
    Tokens(Backends& backends, const std::vector<int32_t>& ids) : b(&backends) {
        cpu = b->cpu->allocate(ids.size(), DType::f32);
        gpu = b->gpu->allocate(ids.size(), DType::f32);
        b->cpu->upload(cpu.data, ids.data(), ids.size() * sizeof(int32_t));
        b->gpu->upload(gpu.data, ids.data(), ids.size() * sizeof(int32_t));
    }
    ~Tokens() {
        b->cpu->release(cpu.data);
        b->gpu->release(gpu.data);
    }
    const int32_t* on_cpu() const { return static_cast<const int32_t*>(cpu.data); }
    const int32_t* on_gpu() const { return static_cast<const int32_t*>(gpu.data); }
};

}  // namespace gpu_test
