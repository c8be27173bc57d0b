// The seams a part is built on, on one rank through the part-level harness (part_runner.h):
// every linear of a part computes through the GEMM policy the part options give it
// (model/gemm.h: FP8's or a 4-bit base's would be another), and a policy that computes
// otherwise changes what the part computes, the part unchanged.
#include <catch2/catch.hpp>
#include <cstdint>
#include <random>

#include "kernels/dtype.h"
#include "model/gemm.h"
#include "part_runner.h"
#include "solo_grid.h"

using namespace trident;

namespace {

// The dense GEMM, counted; with `rounded`, the weights rounded to bf16 first (a stand-in for a
// lower-precision format's GEMM).
class CountingGemm final : public model::GemmPolicy {
public:
    explicit CountingGemm(bool rounded = false) : rounded_(rounded) {}
    mutable int forwards = 0, backwards = 0;

    void forward(model::PartContext& ctx, const model::LinearWeights& w, kernels::Ptr y,
                 kernels::ConstPtr x, int rows, bool bias) const override {
        ++forwards;
        if (rounded_) round_weights(ctx, w);
        model::dense_gemm().forward(ctx, w, y, x, rows, bias);
    }
    void backward(model::PartContext& ctx, const model::LinearWeights& w, kernels::Ptr dx,
                  bool weights, kernels::ConstPtr dy, kernels::ConstPtr x,
                  int rows) const override {
        ++backwards;
        model::dense_gemm().backward(ctx, w, dx, weights, dy, x, rows);
    }

private:
    static void round_weights(model::PartContext& ctx, const model::LinearWeights& w) {
        const std::size_t n = static_cast<std::size_t>(w.in) * static_cast<std::size_t>(w.out);
        std::vector<float> host(n);
        ctx.ops.copy_to_host(host.data(), ctx.weights.params.at(w.weight), n);
        for (float& v : host) v = kernels::from_bf16(kernels::to_bf16(v));
        ctx.ops.copy_from_host(ctx.weights.params.at(w.weight), host.data(), n);
    }
    bool rounded_;
};

test::Tensors attention_inputs() {
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 0.5f);
    const auto values = [&](std::size_t n) {
        std::vector<float> v(n);
        for (float& x : v) x = normal(rng);
        return v;
    };
    const std::size_t H = 32, N = 16;
    return {{"h.0.attn.c_attn.weight", values(3 * H * H)},
            {"h.0.attn.c_attn.bias", values(3 * H)},
            {"h.0.attn.c_proj.weight", values(H * H)},
            {"h.0.attn.c_proj.bias", values(H)},
            {"x", values(N * H)},
            {"dy", values(N * H)}};
}

}  // namespace

TEST_CASE("parts: a part's linears compute through the GEMM policy the options give", "[parts]") {
    auto ops = kernels::make_cpu_ops(1);
    parallel::Grid& solo = test::solo_grid();
    test::PartCase c;
    c.part = "attention:gpt2";
    c.shape = model::GptShape{100, 0, 8, 1, 32, 4, 64, 4};
    c.batch = 2;
    const test::Tensors inputs = attention_inputs();
    const test::Tensors dense = test::run_part(*ops, c, inputs, solo.tensor());

    const CountingGemm counting;
    c.gemm = &counting;
    const test::Tensors counted = test::run_part(*ops, c, inputs, solo.tensor());
    CHECK(counting.forwards == 2);   // qkv, then the projection
    CHECK(counting.backwards == 2);  // each linear's input and weights' gradients
    CHECK(counted == dense);         // bitwise: the dense GEMM through the policy

    const CountingGemm rounded(true);
    c.gemm = &rounded;
    const test::Tensors low = test::run_part(*ops, c, inputs, solo.tensor());
    CHECK(rounded.forwards == 2);
    CHECK(low.at("y") != dense.at("y"));  // the part computes what its policy computes
}
