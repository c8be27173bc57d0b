// The training machinery in process: LR schedule, clipping and determinism of whole steps.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "config/config.h"
#include "kernels/ops.h"
#include "kernels/random.h"
#include "optim/clipping.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "solo_grid.h"
#include "train/trainer.h"

using namespace trident;

namespace {

config::Config tiny_config(const std::vector<std::string>& overrides = {}) {
    return config::parse(
        "model: {vocab_size: 50, seq_len: 8, layers: 2, hidden: 16, heads: 2, ffn_hidden: 32}\n"
        "training: {micro_batch: 2, global_batch: 4, steps: 4, warmup_steps: 1, threads: 1}\n"
        "data: {train: unused.bin}\n",
        "tiny.yaml", overrides);
}

const train::SampleFn kRandomTokens = [](uint64_t k, std::span<int32_t> in,
                                         std::span<int32_t> tgt) {
    for (std::size_t i = 0; i < in.size(); ++i) {
        in[i] = static_cast<int32_t>(kernels::hash64(k, i) % 50);
        tgt[i] = static_cast<int32_t>(kernels::hash64(k, i + 1) % 50);
    }
};

}  // namespace

TEST_CASE("lr schedule: warm-up then cosine, linear or constant", "[training]") {
    config::TrainingConfig t;
    t.lr = 1.0;
    t.min_lr = 0.1;
    t.warmup_steps = 4;
    t.steps = 14;
    REQUIRE(optim::learning_rate(t, 0) == Approx(0.25));
    REQUIRE(optim::learning_rate(t, 3) == Approx(1.0));
    REQUIRE(optim::learning_rate(t, 4) == Approx(1.0));   // decay starts at peak
    REQUIRE(optim::learning_rate(t, 9) == Approx(0.55));  // half way: the mean
    REQUIRE(optim::learning_rate(t, 13) == Approx(0.1 + 0.45 * (1 + std::cos(M_PI * 0.9))));
    t.decay = config::Decay::linear;
    REQUIRE(optim::learning_rate(t, 9) == Approx(0.55));
    REQUIRE(optim::learning_rate(t, 11) == Approx(1.0 - 0.9 * 0.7));
    t.decay = config::Decay::constant;
    REQUIRE(optim::learning_rate(t, 12) == Approx(1.0));
}

TEST_CASE("clipping scales by max/(norm + 1e-6) only above the threshold", "[training]") {
    const config::Config cfg = tiny_config({"training.grad_clip=0.5"});
    auto ops = kernels::make_cpu_ops(1);
    const model::ParamLayout layout(model::GptShape{50, 128, 8, 1, 4, 2, 8, 2});
    model::FlatBuffer params(*ops, layout.total(), kernels::DType::f32);
    model::FlatBuffer grads(*ops, layout.total(), kernels::DType::f32);
    parallel::Grid& solo = test::solo_grid();
    const data_parallel::DataParallel whole(
        *ops, {{}, params, grads, layout.total(), {}},
        {solo.data_context(), solo.data_replica(), solo.embedding(), solo.expert_shard()},
        {0, SIZE_MAX, {}, {}});
    const optim::GradNorm norm(
        *ops, optim::owned_ranges(layout, whole.owned()), grads, whole,
        optim::NormGroups{solo.tensor(), solo.pipeline(), solo.group(parallel::Group::expert)});
    std::vector<float> g(layout.total(), 0.0f);
    g[0] = 3.0f;
    g[1] = 4.0f;
    grads.from_host(g);
    REQUIRE(norm.norm() == Approx(5.0));
    const double max = cfg.training.grad_clip;
    REQUIRE(optim::clip_factor(max, 5.0) == Approx(0.5 / (5.0 + 1e-6)));
    REQUIRE(optim::clip_factor(max, 0.4) == 1.0f);  // below the threshold: untouched
}

TEST_CASE("whole steps are bitwise reproducible, with dropout", "[training]") {
    const config::Config cfg = tiny_config({"model.dropout=0.1"});
    std::vector<double> losses[2];
    std::vector<float> params[2];
    for (int run = 0; run < 2; ++run) {
        auto ops = kernels::make_cpu_ops(2);
        train::Trainer trainer(cfg, *ops, test::solo_grid());
        model::init_random(trainer.model().weights(), cfg.training.seed, 0.02f);
        for (int s = 0; s < 3; ++s) losses[run].push_back(trainer.step(s, kRandomTokens).loss);
        params[run] = trainer.model().weights().params_to_host();
    }
    REQUIRE(losses[0] == losses[1]);
    REQUIRE(params[0] == params[1]);
    REQUIRE(losses[0][0] != losses[0][2]);  // the steps did update the model
}

TEST_CASE("padded vocabulary rows stay zero and never get a gradient", "[training]") {
    const config::Config cfg = tiny_config();
    auto ops = kernels::make_cpu_ops(1);
    train::Trainer trainer(cfg, *ops, test::solo_grid());
    model::init_random(trainer.model().weights(), cfg.training.seed, 0.02f);
    for (int s = 0; s < 2; ++s) trainer.step(s, kRandomTokens);
    const auto& layout = trainer.model().layout();
    const auto params = trainer.model().weights().params_to_host();
    const auto grads = trainer.model().weights().grads_to_host();
    const std::size_t H = 16;
    for (std::size_t i = 50 * H; i < 128 * H; ++i) {
        REQUIRE(params[layout.wte() + i] == 0.0f);
        REQUIRE(grads[layout.wte() + i] == 0.0f);
    }
}

TEST_CASE("loss scaler: backoff on overflow, growth after a clean window, a floor", "[training]") {
    const config::Config fp16 =
        tiny_config({"training.precision=fp16", "training.loss_scale=1024",
                     "training.loss_scale_window=3", "training.min_loss_scale=256"});
    optim::LossScaler scaler(fp16.training);
    REQUIRE(scaler.dynamic());
    REQUIRE(scaler.scale() == 1024);
    CHECK_FALSE(scaler.update(false, 1));  // overflow: skip, halve
    CHECK(scaler.scale() == 512);
    CHECK(scaler.update(true, 2));
    CHECK(scaler.update(true, 3));
    CHECK(scaler.scale() == 512);
    CHECK(scaler.update(true, 4));  // the third clean step in a row: double
    CHECK(scaler.scale() == 1024);
    CHECK(scaler.good_steps() == 0);
    CHECK_FALSE(scaler.update(false, 5));
    CHECK_FALSE(scaler.update(false, 6));
    CHECK(scaler.scale() == 256);  // at the floor
    CHECK_THROWS_WITH(
        scaler.update(false, 7),
        Catch::StartsWith("step 7: the gradients overflow at the smallest loss scale"));

    const config::Config bf16 = tiny_config({"training.precision=bf16"});
    optim::LossScaler unscaled(bf16.training);
    CHECK_FALSE(unscaled.dynamic());
    CHECK(unscaled.scale() == 1);
    CHECK(unscaled.update(true, 1));
    CHECK(unscaled.update(false, 2));  // no overflow to speak of: the trainer's guard judges
}

TEST_CASE("bf16: non-finite gradients stop training, or skip the step, as configured",
          "[training]") {
    for (const char* policy : {"stop", "skip"}) {
        INFO("training.nonfinite: " << policy);
        const config::Config cfg =
            tiny_config({"training.precision=bf16", std::string("training.nonfinite=") + policy});
        auto ops = kernels::make_cpu_ops(1);
        train::Trainer trainer(cfg, *ops, test::solo_grid());
        model::init_random(trainer.model().weights(), cfg.training.seed, 0.02f);
        REQUIRE(trainer.step(0, kRandomTokens).skipped == false);
        // A NaN in one weight poisons the loss and every gradient.
        std::vector<float> params = trainer.full_params();
        const model::ParamLayout layout(trainer.model().layout().shape());
        params[layout.find("ln_f.bias")->offset] = std::nanf("");
        trainer.model().weights().load_whole(params);
        if (std::string(policy) == "stop") {
            CHECK_THROWS_AS(trainer.step(1, kRandomTokens), train::TrainingStopped);
            CHECK_THROWS_WITH(trainer.step(1, kRandomTokens),
                              "step 2: the loss or gradients are not finite; training stopped "
                              "(training.nonfinite: skip would skip such steps; a lower "
                              "training.lr or training.grad_clip may help)");
        } else {
            const std::vector<float> before = trainer.full_params();
            const train::StepResult r = trainer.step(1, kRandomTokens);
            CHECK(r.skipped);
            CHECK(r.skip_reason == "nonfinite");
            CHECK(r.skip_note ==
                  "step 2: the loss or gradients are not finite; the update is skipped on every "
                  "rank (1 in a row; training.max_skipped: 10)");
            const std::vector<float> after = trainer.full_params();  // no update: the same bits
            CHECK(std::memcmp(after.data(), before.data(), after.size() * sizeof(float)) == 0);
        }
    }
}

TEST_CASE("mixed precision: 16-bit parameters and gradients, fp32 master weights", "[training]") {
    for (const char* precision : {"bf16", "fp16"}) {
        for (const char* accumulate : {"false", "true"}) {
            INFO(precision << ", fp32_grad_accumulation " << accumulate);
            const config::Config cfg =
                tiny_config({std::string("training.precision=") + precision,
                             std::string("training.fp32_grad_accumulation=") + accumulate});
            auto ops = kernels::make_cpu_ops(1);
            train::Trainer trainer(cfg, *ops, test::solo_grid());
            const kernels::DType half =
                std::string(precision) == "bf16" ? kernels::DType::bf16 : kernels::DType::f16;
            CHECK(trainer.model().weights().params().dtype() == half);
            CHECK(trainer.model().weights().grads().dtype() ==
                  (std::string(accumulate) == "true" ? kernels::DType::f32 : half));
            model::init_random(trainer.model().weights(), cfg.training.seed, 0.02f);
            const train::StepResult r = trainer.step(0, kRandomTokens);
            const std::size_t n = trainer.model().weights().params().size();
            CHECK(r.memory.parameters == (n * 2 + 63) / 64 * 64);
            CHECK(r.memory.gradients ==
                  (n * (std::string(accumulate) == "true" ? 4 : 2) + 63) / 64 * 64);
            CHECK(r.memory.optimizer == 3 * ((n * 4 + 63) / 64 * 64));  // master, m, v in fp32
            // Every parameter is a 16-bit value: the rounded master weight.
            for (float p : trainer.model().weights().params_to_host())
                REQUIRE(p == kernels::round_to(half, p));
        }
    }
}
