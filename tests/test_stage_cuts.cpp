// Where the pipeline cuts the layers (src/config/stage_cuts.h): the balanced cut against every
// possible cut, the configs' cuts, and what they do to the largest chunk's cost.
#include <algorithm>
#include <catch2/catch.hpp>
#include <functional>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/model_shape.h"
#include "config/stage_cuts.h"
#include "model/flops.h"
#include "plan/stage_shape.h"

namespace {

using namespace trident;

// The largest chunk cost of a cut.
double largest(const std::vector<int>& counts, double layer, double first, double last) {
    double worst = 0;
    for (std::size_t g = 0; g < counts.size(); ++g) {
        double load = counts[g] * layer;
        if (g == 0) load += first;
        if (g + 1 == counts.size()) load += last;
        worst = std::max(worst, load);
    }
    return worst;
}

// The smallest largest-chunk cost over every cut of `layers` into `chunks` counts.
double best_possible(int layers, int chunks, double layer, double first, double last) {
    double best = 1e300;
    std::vector<int> counts(static_cast<std::size_t>(chunks), 0);
    std::function<void(std::size_t, int)> place = [&](std::size_t g, int left) {
        if (g + 1 == counts.size()) {
            counts[g] = left;
            best = std::min(best, largest(counts, layer, first, last));
            return;
        }
        for (int n = 0; n <= left; ++n) {
            counts[g] = n;
            place(g + 1, left - n);
        }
    };
    place(0, layers);
    return best;
}

config::Config bench(const std::vector<std::string>& overrides) {
    return config::load(TRIDENT_SOURCE_DIR "/configs/bench-cpu.yaml", overrides,
                        config::Purpose::plan);
}

// The largest chunk's GEMM FLOPs under the config's cut.
double largest_chunk_flops(const config::Config& cfg) {
    const model::GemmFlops f = model::gemm_flops(model::resolve_spec(config::gpt_shape(cfg)),
                                                 config::rank_dims(cfg), cfg.training.recompute);
    return largest(cfg.derived.chunk_layers, f.layer_forward + f.layer_backward, 0.0,
                   f.head_forward + f.head_backward);
}

}  // namespace

TEST_CASE("stage cuts: the balanced cut is the best of every cut", "[plan][stage-cuts]") {
    for (int layers = 0; layers <= 8; ++layers)
        for (int chunks = 1; chunks <= 4; ++chunks)
            for (double last : {0.0, 2.5, 10.0})
                for (double first : {0.0, 1.5}) {
                    INFO(layers << " layers, " << chunks << " chunks, extras " << first << ", "
                                << last);
                    const std::vector<int> cut =
                        config::balanced_layers(layers, chunks, 1.0, first, last);
                    int total = 0;
                    for (int n : cut) total += n;
                    CHECK(static_cast<int>(cut.size()) == chunks);
                    CHECK(total == layers);
                    CHECK(largest(cut, 1.0, first, last) ==
                          best_possible(layers, chunks, 1.0, first, last));
                }
}

TEST_CASE("stage cuts: the configs' cuts", "[plan][stage-cuts]") {
    // The benchmark model's LM head over 50304 words costs more than its 6 layers together:
    // auto gives the last of 2 stages the head alone.
    CHECK(bench({"parallel.pipeline=2"}).derived.chunk_layers == std::vector<int>{6, 0});
    CHECK(bench({"parallel.pipeline=2", "parallel.stage_layers=uniform"}).derived.chunk_layers ==
          std::vector<int>{3, 3});
    CHECK(bench({"parallel.pipeline=2", "parallel.stage_layers=[5, 1]"}).derived.chunk_layers ==
          std::vector<int>{5, 1});
    CHECK(bench({}).derived.chunk_layers == std::vector<int>{6});
    const config::Config four = bench({"parallel.pipeline=4"});
    int total = 0;
    for (int n : four.derived.chunk_layers) total += n;
    CHECK(total == 6);
    CHECK(four.derived.chunk_layers.back() == 0);
    // Interleaved: one count per global chunk.
    CHECK(
        bench({"parallel.pipeline=2", "parallel.virtual_stages=2", "parallel.schedule=interleaved",
               "parallel.stage_layers=uniform", "model.layers=8", "training.global_batch=16"})
            .derived.chunk_layers == std::vector<int>{2, 2, 2, 2});
}

// In the cost model auto minimises; whether its cuts make the busiest stage compute less is
// timed on real runs (tests/python/test_pipeline_parallel.py, "stage cuts, timed").
TEST_CASE("stage cuts: auto lowers the largest chunk's modelled cost below uniform's",
          "[plan][stage-cuts]") {
    for (const char* P : {"parallel.pipeline=2", "parallel.pipeline=3"}) {
        INFO(P);
        const double uniform = largest_chunk_flops(bench({P, "parallel.stage_layers=uniform"}));
        const double balanced = largest_chunk_flops(bench({P}));
        CHECK(balanced < uniform);
    }
}

TEST_CASE("stage cuts: counts that do not cut the model are refused", "[plan][stage-cuts]") {
    const auto error_of = [](const std::vector<std::string>& overrides) {
        try {
            bench(overrides);
        } catch (const config::ConfigError& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    CHECK_THAT(error_of({"parallel.pipeline=2", "parallel.stage_layers=[6]"}),
               Catch::Contains("1 counts given, but the model has parallel.pipeline × "
                               "virtual_stages = 2 chunks"));
    CHECK_THAT(error_of({"parallel.pipeline=2", "parallel.stage_layers=[4, 4]"}),
               Catch::Contains("the counts add up to 8, but model.layers is 6"));
    CHECK_THAT(error_of({"parallel.pipeline=2", "parallel.stage_layers=[4, -2]"}),
               Catch::Contains("item 2: expected a layer count >= 0"));
    CHECK_THAT(error_of({"parallel.stage_layers=some"}),
               Catch::Contains("expected uniform, auto or a list of layer counts"));
}
