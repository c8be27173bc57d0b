// The CPU op set's Newton-Schulz iterations (kernels/ops.h, Ops::newton_schulz) on their own:
// fp32 pushes a normalised matrix's singular values towards 1 (the diagonal of X·Xᵀ), and bf16
// leaves every element a bf16 value (each product rounded) yet lands near fp32's (bf16's
// rounding, a few units of 2^-8, not more). Muon's training with both, against PyTorch, is
// tests/python/test_muon.py.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "kernels/random.h"

using namespace trident;

namespace {

constexpr int kRows = 24, kCols = 80;

// (kRows, kCols) normal values over their Frobenius norm, as Muon's step gives the iterations.
std::vector<float> normalised() {
    std::vector<float> x(static_cast<std::size_t>(kRows * kCols));
    double sum = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        x[i] = static_cast<float>(kernels::normal(11, i));
        sum += static_cast<double>(x[i]) * x[i];
    }
    for (float& e : x) e = static_cast<float>(e / std::sqrt(sum));
    return x;
}

std::vector<float> iterated(kernels::Ops& ops, kernels::DType precision) {
    std::vector<float> x = normalised();
    std::vector<float> scratch(kernels::newton_schulz_scratch(kRows, kCols));
    // The CPU's memory is the host's.
    ops.newton_schulz(x.data(), scratch.data(), kRows, kCols, 5, precision);
    return x;
}

}  // namespace

TEST_CASE("newton-schulz: fp32 orthogonalises, bf16 rounds each product", "[muon]") {
    const auto ops = kernels::make_cpu_ops(1);
    const std::vector<float> fp32 = iterated(*ops, kernels::DType::f32);
    const std::vector<float> bf16 = iterated(*ops, kernels::DType::bf16);
    // Row norms of X (the diagonal of X·Xᵀ): near 1 after five iterations (the quintic's
    // fixed band, roughly [0.7, 1.2]), from 1/√kRows before.
    for (int i = 0; i < kRows; ++i) {
        double norm = 0;
        for (int j = 0; j < kCols; ++j)
            norm += std::pow(fp32[static_cast<std::size_t>(i * kCols + j)], 2);
        CHECK(std::sqrt(norm) > 0.6);
        CHECK(std::sqrt(norm) < 1.3);
    }
    int fp32_off_grid = 0;
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < bf16.size(); ++i) {
        CHECK(kernels::round_to(kernels::DType::bf16, bf16[i]) == bf16[i]);
        if (kernels::round_to(kernels::DType::bf16, fp32[i]) != fp32[i]) ++fp32_off_grid;
        diff += std::pow(static_cast<double>(bf16[i]) - fp32[i], 2);
        norm += std::pow(static_cast<double>(fp32[i]), 2);
    }
    CHECK(fp32_off_grid > static_cast<int>(fp32.size()) / 2);
    const double apart = std::sqrt(diff / norm);
    INFO("bf16 against fp32: " << apart);
    CHECK(apart > 1e-3);
    CHECK(apart < 5e-2);
}
