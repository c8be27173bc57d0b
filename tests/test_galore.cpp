// GaLore's parts on their own (optim/galore.h): the host SVD and its sign convention
// (kernels/host_svd.h), and the planner's count of GaLore's optimizer FLOPs (docs/FORMULAS.md).
// Its training against PyTorch, on every layout, is tests/python/test_galore.py.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cli_support.h"
#include "io/json_reader.h"
#include "kernels/host_svd.h"

using namespace trident;

namespace {

std::vector<float> random_matrix(int m, int n, unsigned seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> normal;
    std::vector<float> a(static_cast<std::size_t>(m * n));
    for (float& x : a) x = normal(gen);
    return a;
}

// The component of largest magnitude among `count` at `x`, `stride` apart (the first on a tie).
float largest(const float* x, int count, int stride) {
    float best = x[0];
    for (int i = 1; i < count; ++i)
        if (std::fabs(x[i * stride]) > std::fabs(best)) best = x[i * stride];
    return best;
}

}  // namespace

// u·diag(s)·vt gives a back, tall, wide and square, singular values descending; after the
// sign fix each singular vector's largest component is positive.
TEST_CASE("host SVD: thin factors reconstruct the matrix, signs fixed", "[galore]") {
    for (const auto& [m, n] : {std::pair{7, 3}, std::pair{3, 7}, std::pair{5, 5}}) {
        INFO(m << " x " << n);
        const std::vector<float> a = random_matrix(m, n, 11);
        std::vector<float> work = a;
        kernels::Svd svd = kernels::host_svd(work, m, n);
        const int k = std::min(m, n);
        double worst = 0;
        for (int i = 0; i < m; ++i)
            for (int j = 0; j < n; ++j) {
                double sum = 0;
                for (int l = 0; l < k; ++l) sum += svd.u[i * k + l] * svd.s[l] * svd.vt[l * n + j];
                worst = std::max(worst, std::fabs(sum - a[i * n + j]));
            }
        CHECK(worst < 1e-5);
        for (int j = 1; j < k; ++j) CHECK(svd.s[j - 1] >= svd.s[j]);
        kernels::fix_column_signs(svd.u, m, k);
        kernels::fix_row_signs(svd.vt, k, n);
        for (int j = 0; j < k; ++j) {
            CHECK(largest(svd.u.data() + j, m, k) > 0);
            CHECK(largest(svd.vt.data() + j * n, n, 1) > 0);
        }
    }
}

// A tie in magnitude: the lowest index decides.
TEST_CASE("host SVD: a tie in magnitude is decided by the lowest index", "[galore]") {
    std::vector<float> u = {-0.5f, 0.5f, 0.5f, -0.5f};  // (2, 2): columns (-.5, .5), (.5, -.5)
    kernels::fix_column_signs(u, 2, 2);
    CHECK(u == std::vector<float>{0.5f, 0.5f, -0.5f, -0.5f});
    std::vector<float> vt = {-0.5f, 0.5f, 0.3f, 0.5f, -0.5f, 0.3f};  // (2, 3)
    kernels::fix_row_signs(vt, 2, 3);
    CHECK(vt == std::vector<float>{0.5f, -0.5f, -0.3f, 0.5f, -0.5f, 0.3f});
}

// Per matrix (m, n), k = min(m, n), r = min(rank, k): the projection and the projection back,
// 2·m·n·r each, and the SVD's 6·m·n·k + 20·k³ every update_gap updates (docs/FORMULAS.md), over
// GPT-2 124M's layer matrices (c_attn 2304 x 768, c_proj 768 x 768, c_fc 3072 x 768, mlp
// c_proj 768 x 3072; 12 layers).
TEST_CASE("plan: GaLore's optimizer FLOPs, projections every step and SVDs every gap",
          "[plan][galore]") {
    const auto galore = [](double m, double n, double rank, double gap) {
        const double k = std::min(m, n), r = std::min(rank, k);
        return 4 * m * n * r + (6 * m * n * k + 20 * k * k * k) / gap;
    };
    const double want = 12 * (galore(2304, 768, 128, 200) + galore(768, 768, 128, 200) +
                              2 * galore(3072, 768, 128, 200));
    const auto out = cli::run("plan --config " TRIDENT_SOURCE_DIR
                              "/configs/gpt2-124m.yaml --hardware dgx-h100 --json --set "
                              "optimizer.name=galore");
    INFO(out.output);
    REQUIRE(out.exit_code == 0);
    const io::json::Value plan = io::json::parse(out.output);
    const io::json::Value* counted = plan.find("flops")->find("optimizer_flops_per_step");
    const double got =
        counted->is_integer() ? static_cast<double>(counted->integer) : counted->real;
    CHECK(std::abs(got - want) <= 1e-8 * want);
}
