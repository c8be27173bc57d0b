// The split backward of the zero-bubble schedules on one process: B then W gives bitwise the
// gradients, losses and updates of the whole backward (1F1B), with dropout, recompute and
// 16-bit precision, and each activation set holds what B keeps for W.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "config/config.h"
#include "kernels/ops.h"
#include "kernels/random.h"
#include "solo_grid.h"
#include "train/trainer.h"

using namespace trident;

namespace {

config::Config small_config(const std::string& schedule, const std::string& recompute,
                            const std::string& precision) {
    return config::parse(
        "model: {vocab_size: 100, seq_len: 16, layers: 3, hidden: 32, heads: 4, "
        "ffn_hidden: 128, dropout: 0.1}\n"
        "parallel: {schedule: " +
            schedule +
            "}\n"
            "training: {micro_batch: 2, global_batch: 8, steps: 3, warmup_steps: 1, threads: 2,\n"
            "           recompute: " +
            recompute + ", precision: " + precision + "}\n",
        "small.yaml", {}, config::Purpose::bench);
}

const train::SampleFn kRandomTokens = [](uint64_t k, std::span<int32_t> in,
                                         std::span<int32_t> tgt) {
    for (std::size_t i = 0; i < in.size(); ++i) {
        in[i] = static_cast<int32_t>(kernels::hash64(k, i) % 100);
        tgt[i] = static_cast<int32_t>(kernels::hash64(k, i + 1) % 100);
    }
};

struct Run {
    std::vector<float> grads;                // after the first accumulate_gradients
    std::vector<double> losses;              // of each step
    std::vector<std::vector<float>> params;  // after each step
    std::size_t bytes_per_set = 0;
};

Run train_with(const std::string& schedule, const std::string& recompute,
               const std::string& precision) {
    const config::Config cfg = small_config(schedule, recompute, precision);
    auto ops = kernels::make_cpu_ops(2);
    train::Trainer trainer(cfg, *ops, test::solo_grid());
    model::init_random(trainer.model().weights(), cfg.training.seed, 0.02f);
    Run run;
    trainer.accumulate_gradients(0, kRandomTokens);
    run.grads = trainer.model().weights().grads_to_host();
    run.bytes_per_set = trainer.model().activations().bytes / trainer.model().activations().sets;
    for (int s = 0; s < 3; ++s) {
        run.losses.push_back(trainer.step(s, kRandomTokens).loss);
        run.params.push_back(trainer.model().weights().params_to_host());
    }
    return run;
}

}  // namespace

TEST_CASE("zero bubble: B then W trains bitwise as the whole backward", "[zero-bubble]") {
    for (const char* precision : {"fp32", "bf16"})
        for (const char* recompute : {"none", "selective", "full"}) {
            const Run whole = train_with("1f1b", recompute, precision);
            for (const char* schedule : {"zb-h1", "zb-h2"}) {
                INFO(schedule << ", recompute " << recompute << ", " << precision);
                const Run split = train_with(schedule, recompute, precision);
                REQUIRE(split.grads == whole.grads);
                REQUIRE(split.losses == whole.losses);
                for (std::size_t s = 0; s < whole.params.size(); ++s)
                    REQUIRE(split.params[s] == whole.params[s]);
                // Each set also keeps, for W, per layer the output gradients of the four
                // linears, (N,C) (N,F) (N,C) (N,3C), and the two LayerNorms, (R,C) each, and
                // the final LayerNorm's and the embedding's (R,H): N = R = 32, H = 32, F = 128.
                const std::size_t element = std::string(precision) == "fp32" ? 4 : 2;
                const std::size_t per_layer = (2 * 32 * 32 + 32 * 128 + 3 * 32 * 32 + 2 * 32 * 32);
                CHECK(split.bytes_per_set - whole.bytes_per_set ==
                      element * (3 * per_layer + 2 * 32 * 32));
            }
            REQUIRE(whole.losses[0] != whole.losses[2]);  // the steps did update the model
        }
}
