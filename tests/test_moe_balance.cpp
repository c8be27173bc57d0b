// A mixture of experts' loads (train/moe_balance.h): the bias's step of DeepSeek-V3's
// balancing, the metrics' figures of a layer's load (and TensorBoard's) and the router-collapse
// warning.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>

#include "train/metrics.h"
#include "train/moe_balance.h"

using namespace trident;

TEST_CASE("moe balance: the bias steps against each expert's excess, 0 at the mean", "[moe]") {
    // Mean 6: expert 0 under it, 1 at it, 2 and 3 over it.
    const std::vector<float> step = train::bias_step({2, 6, 7, 9}, 0.25);
    CHECK(step == std::vector<float>{0.25f, 0.0f, -0.25f, -0.25f});
    CHECK(train::bias_step({3, 3, 3}, 0.5) == std::vector<float>{0, 0, 0});
}

TEST_CASE("moe balance: each MoE layer's load and its figures", "[moe]") {
    model::MoeSettings moe;
    moe.experts = 2;
    moe.every = 2;  // layers 1 and 3 of 4
    const std::vector<double> tokens = {0, 0, 3, 5, 0, 0, 8, 0};
    const std::vector<train::MoeLayerLoad> loads = train::moe_loads(moe, 4, tokens, {0, 2, 0, 0});
    REQUIRE(loads.size() == 2);
    CHECK(loads[0].layer == 1);
    CHECK(loads[0].tokens == std::vector<double>{3, 5});
    CHECK(loads[0].min() == 3);
    CHECK(loads[0].max() == 5);
    CHECK(loads[0].cv() == Approx(0.25));  // population std 1 over mean 4
    CHECK(loads[0].dropped == 2);
    CHECK(loads[1].layer == 3);
    CHECK(loads[1].cv() == Approx(1.0));  // {8, 0}: std 4, mean 4
    CHECK(loads[1].dropped == 0);
}

TEST_CASE("moe balance: an expert without a token for 100 steps is named once", "[moe]") {
    train::CollapseWatch watch;
    const train::MoeLayerLoad idle{2, {4, 0, 4}};
    const train::MoeLayerLoad busy{2, {4, 1, 3}};
    for (int step = 1; step < train::CollapseWatch::kSteps; ++step)
        CHECK(watch.observe(step, {idle}).empty());
    // A token on step 100 starts the count again.
    CHECK(watch.observe(100, {busy}).empty());
    for (int step = 101; step < 100 + train::CollapseWatch::kSteps; ++step)
        CHECK(watch.observe(step, {idle}).empty());
    const std::vector<std::string> lines = watch.observe(200, {idle});
    REQUIRE(lines.size() == 1);
    CHECK(lines[0] ==
          "step 200: layer 2's expert 1 received no token for 100 steps in a row (router "
          "collapse; said once per expert)");
    CHECK(watch.observe(201, {idle}).empty());  // said once
}

TEST_CASE("moe balance: TensorBoard shows each MoE layer's figures", "[moe]") {
    train::StepMetrics m;
    m.moe_aux_loss = 1.5;
    m.moe_loads = {{1, {3, 5}}};
    std::map<std::string, double> scalars;
    for (const auto& [tag, value] : train::tensorboard_scalars(m)) scalars[tag] = value;
    CHECK(scalars.at("moe/aux_loss") == 1.5);
    CHECK(scalars.count("moe/z_loss") == 0);
    CHECK(scalars.at("moe/layer_1/tokens_min") == 3);
    CHECK(scalars.at("moe/layer_1/tokens_max") == 5);
    CHECK(scalars.at("moe/layer_1/tokens_cv") == Approx(0.25));
    CHECK(scalars.at("moe/layer_1/dropped") == 0);
}
