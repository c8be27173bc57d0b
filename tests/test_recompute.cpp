// Activation recompute (training.recompute): selective and full give bitwise the gradients,
// losses and updates of no recompute, and keep the bytes Korthikanti et al. count.
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "config/config.h"
#include "kernels/ops.h"
#include "kernels/random.h"
#include "solo_grid.h"
#include "train/trainer.h"

using namespace trident;

namespace {

// B = 2, T = 16 (N = R = 32 rows), H = 32, NH = 4, F = 128, V = 100 (Vp = 128).
constexpr std::size_t kB = 2, kT = 16, kN = kB * kT, kC = 32, kHeads = 4, kF = 128, kVp = 128;

config::Config small_config(const std::string& recompute, int layers,
                            const std::string& precision = "fp32") {
    return config::parse(
        "model: {vocab_size: 100, seq_len: 16, layers: " + std::to_string(layers) +
            ", hidden: 32, heads: 4, ffn_hidden: 128, dropout: 0.1}\n"
            "training: {micro_batch: 2, global_batch: 4, steps: 3, warmup_steps: 1, threads: 2,\n"
            "           recompute: " +
            recompute + ", precision: " + precision +
            "}\n"
            "data: {train: unused.bin}\n",
        "small.yaml");
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
    double eval_loss = 0;
};

Run train_with(const std::string& recompute, const std::string& precision) {
    const config::Config cfg = small_config(recompute, 3, precision);
    auto ops = kernels::make_cpu_ops(2);
    train::Trainer trainer(cfg, *ops, test::solo_grid());
    model::init_random(trainer.model().weights(), cfg.training.seed, 0.02f);
    Run run;
    trainer.accumulate_gradients(0, kRandomTokens);
    run.grads = trainer.model().weights().grads_to_host();
    for (int s = 0; s < 3; ++s) {
        run.losses.push_back(trainer.step(s, kRandomTokens).loss);
        run.params.push_back(trainer.model().weights().params_to_host());
    }
    run.eval_loss = trainer.evaluate(kRandomTokens, 2 * cfg.training.micro_batch);
    return run;
}

// Bytes of one activation set of a one-stage model with `layers` layers.
std::size_t bytes_per_set(const std::string& recompute, int layers,
                          const std::string& precision = "fp32") {
    const config::Config cfg = small_config(recompute, layers, precision);
    auto ops = kernels::make_cpu_ops(2);
    train::Trainer trainer(cfg, *ops, test::solo_grid());
    model::init_random(trainer.model().weights(), cfg.training.seed, 0.02f);
    trainer.accumulate_gradients(0, kRandomTokens);
    REQUIRE(trainer.model().activations().sets >= 1);
    return trainer.model().activations().bytes / trainer.model().activations().sets;
}

}  // namespace

TEST_CASE("recompute: selective and full train bitwise as none, with dropout", "[recompute]") {
    for (const char* precision : {"fp32", "bf16"}) {
        const Run none = train_with("none", precision);
        for (const char* mode : {"selective", "full"}) {
            INFO("recompute: " << mode << ", precision " << precision);
            const Run run = train_with(mode, precision);
            REQUIRE(run.grads == none.grads);
            REQUIRE(run.losses == none.losses);
            for (std::size_t s = 0; s < none.params.size(); ++s)
                REQUIRE(run.params[s] == none.params[s]);
            REQUIRE(run.eval_loss == none.eval_loss);
        }
        REQUIRE(none.losses[0] != none.losses[2]);  // the steps did update the model
    }
}

TEST_CASE("recompute: the bytes kept per set, per layer and fixed", "[recompute]") {
    const std::size_t R = kN;  // no sequence parallelism: a rank holds every row
    // Embedding and head, kept by every mode: token ids (inputs, targets), the chunk's input,
    // lnf with its mean and rstd, the logits, the loss statistics, lse and losses.
    const std::size_t fixed = 4 * (2 * kN + R * kC + R * kC + 2 * R + kN * kVp + 4 * kN + 2 * kN);
    const std::size_t att = 4 * kB * kHeads * kT * kT;  // (B,NH,T,T), 5·a·s/h in Korthikanti
    // Without recompute a layer keeps ln1 (+mean, rstd), qkv, att, atty, resid2, ln2 (+mean,
    // rstd), fch, fch_gelu and its output.
    const std::size_t none_layer = 4 * (R * kC + 2 * R + 3 * kN * kC + kN * kC + R * kC + R * kC +
                                        2 * R + 2 * kN * kF + R * kC) +
                                   att;
    const std::size_t full_layer = 4 * R * kC;  // the layer's output: the next one's input

    for (int layers : {2, 4}) {
        INFO("layers: " << layers);
        CHECK(bytes_per_set("none", layers) == fixed + layers * none_layer);
        CHECK(bytes_per_set("selective", layers) == fixed + layers * (none_layer - att));
        CHECK(bytes_per_set("full", layers) == fixed + layers * full_layer);
    }
    // The per-layer part on its own, from two depths.
    CHECK((bytes_per_set("full", 4) - bytes_per_set("full", 2)) / 2 == R * kC * 4);
    CHECK((bytes_per_set("none", 4) - bytes_per_set("none", 2)) / 2 -
              (bytes_per_set("selective", 4) - bytes_per_set("selective", 2)) / 2 ==
          att);

    const std::size_t none = bytes_per_set("none", 3), selective = bytes_per_set("selective", 3),
                      full = bytes_per_set("full", 3);
    CHECK(full < selective);
    CHECK(selective < none);
    WARN("bytes per set, 3 layers: none " << none << ", selective " << selective << ", full "
                                          << full);
}

TEST_CASE("recompute in 16-bit: the bytes per layer Korthikanti et al. predict", "[recompute]") {
    // Per layer and microbatch, s·b·h = T·B·C elements, a = heads. Korthikanti et al. count
    // in 16-bit: none s·b·h·(34 + 5·a·s/h), selective 34·s·b·h, full 2·s·b·h. Trident keeps
    // no dropout masks (they are recomputed from their hash: Korthikanti's 2·s·b·h of masks
    // and, of the 5·a·s/h, the mask and the dropped-out copy), and its LayerNorm statistics
    // are fp32: 32·s·b·h + 4 · 4·s·b bytes selective, 2·a·s²·b more without recompute.
    const double sbh = double(kT) * kB * kC;
    const double stats = 4.0 * 4 * kT * kB;  // mean and rstd of two LayerNorms, fp32
    const double softmax = 2.0 * kHeads * kT * kT * kB;
    for (const char* precision : {"bf16", "fp16"}) {
        INFO("precision " << precision);
        const auto per_layer = [&](const char* mode) {
            return double(bytes_per_set(mode, 4, precision) - bytes_per_set(mode, 2, precision)) /
                   2;
        };
        const double full = per_layer("full"), selective = per_layer("selective"),
                     none = per_layer("none");
        CHECK(full == 2 * sbh);  // exactly Korthikanti's: the layer's input
        CHECK(selective == 32 * sbh + stats);
        CHECK(none == selective + softmax);
        // Against the paper's own figures: the masks are all that differs.
        CHECK(std::abs(selective / (34 * sbh) - 1) < 0.1);
        WARN(precision << " bytes per layer: full " << full << " (paper " << 2 * sbh
                       << "), selective " << selective << " (paper " << 34 * sbh << "), none "
                       << none << " (paper " << sbh * (34 + 5.0 * kHeads * kT / kC) << ")");
        // And every kept set is half the fp32 one, but for fp32 statistics and token ids.
        CHECK(bytes_per_set("full", 2, precision) < bytes_per_set("full", 2) * 0.6);
    }
}
