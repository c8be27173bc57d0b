// llm.c token shards and the deterministic sampler against the sampling contract
// (docs/ARCHITECTURE.md, "Sampling").
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <numeric>
#include <set>
#include <vector>

#include "data/sampler.h"
#include "data/token_shards.h"
#include "kernels/error.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using namespace trident;

namespace {

std::vector<uint16_t> iota_tokens(std::size_t n, uint16_t first, uint16_t modulo) {
    std::vector<uint16_t> t(n);
    for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<uint16_t>((first + i) % modulo);
    return t;
}

}  // namespace

TEST_CASE("data: a glob of shards reads as one stream in name order", "[data]") {
    TempDir tmp("data");
    const auto a = iota_tokens(100, 0, 1000), b = iota_tokens(50, 100, 1000);
    data::write_token_shard(tmp / "part_1.bin", b);  // written first, named second
    data::write_token_shard(tmp / "part_0.bin", a);
    const data::TokenShards shards(tmp / "part_*.bin", 1000, "data.train");
    REQUIRE(shards.files().size() == 2);
    REQUIRE(shards.size() == 150);
    std::vector<int32_t> out(20);
    shards.read(90, out);  // crosses from part_0 into part_1
    for (int i = 0; i < 20; ++i) REQUIRE(out[static_cast<std::size_t>(i)] == 90 + i);
}

TEST_CASE("data: sampling without shuffle follows the contract", "[data]") {
    TempDir tmp("data");
    const std::size_t N = 103;
    const int T = 10;
    data::write_token_shard(tmp / "d.bin", iota_tokens(N, 0, 1000));
    const data::TokenShards shards(tmp / "d.bin", 1000, "data.train");
    data::Sampler sampler(shards, T, false, 1, "data.train");
    const std::size_t W = (N - 1) / T;  // 10
    REQUIRE(sampler.windows() == W);
    std::vector<int32_t> in(T), tgt(T);
    for (uint64_t k : {0ull, 3ull, 9ull, 10ull, 27ull}) {
        sampler.fill(k, in, tgt);
        const int32_t start = static_cast<int32_t>((k % W) * T);
        for (int t = 0; t < T; ++t) {
            REQUIRE(in[static_cast<std::size_t>(t)] == start + t);
            REQUIRE(tgt[static_cast<std::size_t>(t)] == start + t + 1);
        }
    }
}

TEST_CASE("data: shuffled sampling is a per-epoch permutation fixed by the seed", "[data]") {
    TempDir tmp("data");
    data::write_token_shard(tmp / "d.bin", iota_tokens(1001, 0, 2000));
    const data::TokenShards shards(tmp / "d.bin", 2000, "data.train");
    data::Sampler a(shards, 10, true, 42, "data.train"), b(shards, 10, true, 42, "data.train");
    data::Sampler other(shards, 10, true, 43, "data.train");
    const std::size_t W = a.windows();  // 100
    std::set<std::size_t> epoch0, epoch1;
    bool differs_from_other_seed = false, epochs_differ = false;
    for (uint64_t k = 0; k < W; ++k) {
        const std::size_t s0 = a.window_start(k);
        epoch0.insert(s0);
        REQUIRE(s0 % 10 == 0);
        differs_from_other_seed |= s0 != other.window_start(k);
    }
    for (uint64_t k = W; k < 2 * W; ++k) {
        epoch1.insert(a.window_start(k));
        epochs_differ |= a.window_start(k) != a.window_start(k - W);
    }
    REQUIRE(epoch0.size() == W);  // every window once per epoch
    REQUIRE(epoch1.size() == W);
    REQUIRE(differs_from_other_seed);
    REQUIRE(epochs_differ);
    // Depends only on the sample index: visiting out of order gives the same windows.
    for (uint64_t k : {150ull, 3ull, 199ull, 0ull}) REQUIRE(b.window_start(k) == a.window_start(k));
}

TEST_CASE("data: corrupt shards are rejected with the file's name", "[data][bad-input]") {
    TempDir tmp("data");
    REQUIRE_THROWS_WITH(data::TokenShards(tmp / "missing*.bin", 10, "data.train"),
                        Catch::Contains("data.train: no file matches"));
    data::write_token_shard(tmp / "big.bin", iota_tokens(10, 0, 100));
    REQUIRE_THROWS_WITH(
        data::TokenShards(tmp / "big.bin", 5, "data.train"),
        Catch::Contains("big.bin: token id 5 at position 5 is outside the vocabulary"));
    fs::resize_file(tmp / "big.bin", 1024 + 2 * 10 + 2);
    REQUIRE_THROWS_WITH(data::TokenShards(tmp / "big.bin", 100, "data.train"),
                        Catch::Contains("truncated or corrupt"));
}
