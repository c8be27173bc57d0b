// Weighted blends of datasets: the greedy rule against a plain-loop reference, proportions,
// determinism under any visiting order, and a Dataset whose samples come from each dataset's
// own sampler.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <vector>

#include "config/config.h"
#include "data/blend.h"
#include "data/dataset.h"
#include "data/megatron_dataset.h"
#include "data/sampler.h"
#include "data/token_shards.h"
#include "kernels/error.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using namespace trident;

namespace {

// The rule written as plainly as possible: every sample scans all datasets.
std::vector<data::BlendPick> reference_blend(std::vector<double> w, uint64_t samples) {
    double total = 0;
    for (double x : w) total += x;
    for (double& x : w) x /= total;
    std::vector<uint64_t> count(w.size(), 0);
    std::vector<data::BlendPick> picks;
    for (uint64_t k = 0; k < samples; ++k) {
        std::size_t best = 0;
        for (std::size_t i = 1; i < w.size(); ++i)
            if (w[i] * double(k + 1) - double(count[i]) >
                w[best] * double(k + 1) - double(count[best]))
                best = i;
        picks.push_back({best, count[best]++});
    }
    return picks;
}

std::vector<uint16_t> tokens_in(std::size_t n, uint16_t low, uint16_t high) {
    std::vector<uint16_t> t(n);
    for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<uint16_t>(low + i % (high - low));
    return t;
}

}  // namespace

TEST_CASE("blend: picks follow the greedy rule in any visiting order", "[data]") {
    const std::vector<double> weights = {5, 3, 2};
    const uint64_t n = 3 * data::Blend::kBlock + 17;
    const auto expected = reference_blend(weights, n);
    data::Blend in_order(weights), backwards(weights), jumping(weights);
    for (uint64_t k = 0; k < n; ++k) {
        const auto p = in_order.pick(k);
        REQUIRE(p.dataset == expected[k].dataset);
        REQUIRE(p.sample == expected[k].sample);
    }
    for (uint64_t k = n; k-- > 0;) REQUIRE(backwards.pick(k).sample == expected[k].sample);
    for (uint64_t k : {n - 1, uint64_t{5}, 2 * data::Blend::kBlock, uint64_t{0}, n - 2})
        REQUIRE(jumping.pick(k).dataset == expected[k].dataset);
    CHECK(in_order.weights() == std::vector<double>{0.5, 0.3, 0.2});
}

TEST_CASE("blend: realised counts track the weights", "[data]") {
    const std::vector<double> weights = {0.7, 0.3};
    data::Blend blend(weights);
    std::vector<uint64_t> count(2, 0);
    for (uint64_t k = 0; k < 10'000; ++k) {
        const auto p = blend.pick(k);
        REQUIRE(p.sample == count[p.dataset]);  // each dataset's own samples in order
        ++count[p.dataset];
        // Every prefix stays within one sample of its share.
        for (std::size_t i = 0; i < 2; ++i)
            REQUIRE(std::abs(double(count[i]) - weights[i] * double(k + 1)) <= 1.0);
    }
    CHECK(count[0] == 7000);
    CHECK(count[1] == 3000);

    data::Blend single({2.5});
    CHECK(single.pick(123456789).dataset == 0);
    CHECK(single.pick(123456789).sample == 123456789);
    REQUIRE_THROWS_WITH(data::Blend({1.0, 0.0}), Catch::Contains("must be finite and > 0"));
}

TEST_CASE("dataset: a blend fills each sample from its dataset's own sampler", "[data]") {
    TempDir tmp("blend");
    // Dataset 0 (llm.c) holds ids 0..99, dataset 1 (Megatron) ids 100..199: a sample's tokens
    // say where it came from.
    data::write_token_shard(tmp / "a.bin", tokens_in(3001, 0, 100));
    {
        data::MegatronWriter writer(tmp / "b");
        for (int d = 0; d < 20; ++d) writer.add_document(tokens_in(50 + d, 100, 200));
        writer.finish();
    }
    const std::vector<config::DataSource> sources = {{tmp / "a.bin", 7}, {tmp / "b", 3}};
    const int T = 8;
    const uint64_t seed = 1234;
    data::Dataset blend(sources, config::DataFormat::auto_, 256, T, true, seed, "data.train");
    data::Dataset again(sources, config::DataFormat::auto_, 256, T, true, seed, "data.train");
    REQUIRE(blend.datasets() == 2);
    CHECK(blend.weight(0) == Approx(0.7));
    CHECK(blend.summary().find("blend of 2: 70.0% llm.c shard") == 0);

    // Each dataset's own sampler, built independently with its derived seed.
    const data::TokenShards a(tmp / "a.bin", 256, "a");
    const data::MegatronDataset b(tmp / "b", 256, "b");
    data::Sampler own_a(a, T, true, data::Dataset::seed_of(seed, 0), "a");
    data::Sampler own_b(b, T, true, data::Dataset::seed_of(seed, 1), "b");
    CHECK(data::Dataset::seed_of(seed, 0) == seed);
    CHECK(data::Dataset::seed_of(seed, 1) != seed);

    std::vector<int32_t> in(T), tgt(T), own_in(T), own_tgt(T), in2(T), tgt2(T);
    int from_a = 0;
    const int samples = 10'000;
    for (uint64_t k = 0; k < samples; ++k) {
        blend.fill(k, in, tgt);
        const data::BlendPick p = blend.pick(k);
        (p.dataset == 0 ? own_a : own_b).fill(p.sample, own_in, own_tgt);
        REQUIRE(in == own_in);
        REQUIRE(tgt == own_tgt);
        REQUIRE((in[0] < 100) == (p.dataset == 0));
        from_a += p.dataset == 0;
    }
    CHECK(std::abs(from_a / double(samples) - 0.7) < 0.01);
    // Deterministic, whatever order the samples are asked for in.
    for (uint64_t k : {9999ull, 17ull, 4096ull, 0ull}) {
        blend.fill(k, in, tgt);
        again.fill(k, in2, tgt2);
        REQUIRE(in == in2);
    }
}

TEST_CASE("dataset: one source samples exactly as its sampler with the run's seed", "[data]") {
    TempDir tmp("blend");
    data::write_token_shard(tmp / "s.bin", tokens_in(1001, 0, 300));
    const std::vector<config::DataSource> one = {{tmp / "s.bin", 1.0}};
    data::Dataset ds(one, config::DataFormat::auto_, 300, 10, true, 42, "data.train");
    const data::TokenShards shard(tmp / "s.bin", 300, "data.train");
    data::Sampler sampler(shard, 10, true, 42, "data.train");
    std::vector<int32_t> a(10), at(10), b(10), bt(10);
    for (uint64_t k = 0; k < 250; ++k) {
        ds.fill(k, a, at);
        sampler.fill(k, b, bt);
        REQUIRE(a == b);
    }
    CHECK(ds.summary() == "llm.c shard " + (tmp / "s.bin") +
                              ": 1001 tokens, 100 samples per "
                              "epoch, shuffled");
}

TEST_CASE("dataset: errors name the blend item", "[data][bad-input]") {
    TempDir tmp("blend");
    data::write_token_shard(tmp / "a.bin", tokens_in(100, 0, 10));
    const std::vector<config::DataSource> sources = {{tmp / "a.bin", 1}, {tmp / "x*.bin", 1}};
    REQUIRE_THROWS_WITH(
        data::Dataset(sources, config::DataFormat::auto_, 10, 8, true, 1, "data.train"),
        Catch::Contains("data.train[2]: no file matches"));
    const std::vector<config::DataSource> short_one = {{tmp / "a.bin", 1}};
    REQUIRE_THROWS_WITH(
        data::Dataset(short_one, config::DataFormat::auto_, 10, 200, true, 1, "data.valid"),
        Catch::Contains("data.valid: 100 tokens are too few"));
}
