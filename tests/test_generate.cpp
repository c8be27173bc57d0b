// Generation: a model that has memorised a short text reproduces it greedily, and sampling
// follows temperature and top-k.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <string>

#include "config/config.h"
#include "kernels/ops.h"
#include "solo_grid.h"
#include "train/generator.h"
#include "train/trainer.h"

using namespace trident;

TEST_CASE("greedy generation reproduces a memorised text", "[generate]") {
    const std::string text = "the quick brown fox jumps over the lazy dog. ";
    const config::Config cfg = config::parse(
        "model: {vocab_size: 256, seq_len: 16, layers: 2, hidden: 64, heads: 4, ffn_hidden: 128}\n"
        "training: {micro_batch: 8, global_batch: 8, steps: 200, lr: 1.0e-2, min_lr: 1.0e-3,\n"
        "           warmup_steps: 10, weight_decay: 0.0, threads: 2}\n"
        "data: {train: unused.bin}\n",
        "memorise.yaml");
    // Sample k is the window of the endlessly repeated text starting at byte 7k.
    const train::SampleFn windows = [&](uint64_t k, std::span<int32_t> in, std::span<int32_t> tgt) {
        for (std::size_t i = 0; i < in.size(); ++i) {
            in[i] = static_cast<unsigned char>(text[(7 * k + i) % text.size()]);
            tgt[i] = static_cast<unsigned char>(text[(7 * k + i + 1) % text.size()]);
        }
    };
    auto ops = kernels::make_cpu_ops(2);
    train::Trainer trainer(cfg, *ops, test::solo_grid());
    model::init_random(trainer.model().weights(), cfg.training.seed, 0.02f);
    double loss = 0;
    for (int s = 0; s < cfg.training.steps; ++s) loss = trainer.step(s, windows).loss;
    INFO("final loss " << loss);
    REQUIRE(loss < 0.2);

    const std::string prompt = "the quick";
    const std::vector<int32_t> ids(prompt.begin(), prompt.end());
    train::SamplingOptions greedy;
    greedy.tokens = 60;  // past seq_len: the context window slides
    greedy.temperature = 0;
    train::GenerationModel whole(*ops, trainer.model().layout().shape(),
                                 trainer.model().weights().params_to_host());
    const auto out = train::generate(whole.decoder(), ids, greedy);
    const std::string generated(out.begin(), out.end());
    const std::string expected = (text + text).substr(prompt.size(), 60);
    REQUIRE(generated == expected);
}

TEST_CASE("sampling follows temperature and top-k", "[generate]") {
    const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
    train::SamplingOptions opts;
    opts.temperature = 0;
    REQUIRE(train::sample_token(logits, opts, 0) == 1);  // greedy: first of the equal maxima

    opts.temperature = 1.0;
    opts.top_k = 2;
    opts.seed = 5;
    std::map<int32_t, int> counts;
    for (uint64_t draw = 0; draw < 4000; ++draw) ++counts[train::sample_token(logits, opts, draw)];
    REQUIRE(counts.size() == 2);  // only the two likeliest ever come out
    REQUIRE(counts[1] == Approx(2000).margin(150));
    REQUIRE(counts[3] == Approx(2000).margin(150));

    opts.top_k = 0;  // all five, in proportion to exp(logit)
    counts.clear();
    for (uint64_t draw = 0; draw < 20000; ++draw) ++counts[train::sample_token(logits, opts, draw)];
    double z = 0;
    for (float l : logits) z += std::exp(l);
    for (int32_t i = 0; i < 5; ++i)
        REQUIRE(counts[i] / 20000.0 ==
                Approx(std::exp(logits[static_cast<std::size_t>(i)]) / z).margin(0.01));
    REQUIRE(train::sample_token(logits, opts, 7) == train::sample_token(logits, opts, 7));
}
