// Whole training steps on the GPU against the CPU backend: the same model, data and dropout
// masks give the same losses over 20 steps (fp32 within 1e-4, bf16 within 2%), gradient norms
// and (in fp32) parameters, in fp32 and in bf16 with fp32 master weights, with and without
// activation recompute; GPT-2's layer and Llama's; AdamW, Muon (fp32 and bf16 Newton-Schulz
// iterations) and GaLore.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "../solo_grid.h"
#include "config/config.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/random.h"
#include "tests/cuda/backends.h"
#include "train/trainer.h"

using namespace trident;

namespace {

constexpr int kSteps = 20;

config::Config small_config(const std::vector<std::string>& overrides) {
    // Head size 32 and sizes cuDNN takes in 16-bit; vocabulary padded to 128.
    return config::parse(
        "model: {vocab_size: 100, seq_len: 64, layers: 2, hidden: 128, heads: 4, ffn_hidden: 512, "
        "dropout: 0.1}\n"
        "training: {micro_batch: 2, global_batch: 4, steps: 20, warmup_steps: 2, threads: 1}\n"
        "data: {train: unused.bin}\n",
        "small.yaml", overrides);
}

const train::SampleFn kRandomTokens = [](uint64_t k, std::span<int32_t> in,
                                         std::span<int32_t> tgt) {
    for (std::size_t i = 0; i < in.size(); ++i) {
        in[i] = static_cast<int32_t>(kernels::hash64(k, i) % 100);
        tgt[i] = static_cast<int32_t>(kernels::hash64(k, i + 1) % 100);
    }
};

struct Run {
    std::vector<double> losses, norms;
    std::vector<float> params;
};

Run train_steps(kernels::Ops& ops, const config::Config& cfg, int steps) {
    train::Trainer trainer(cfg, ops, test::solo_grid());
    model::init_random(trainer.model().weights(), cfg.training.seed, 0.02f);
    Run run;
    for (int s = 0; s < steps; ++s) {
        const train::StepResult r = trainer.step(s, kRandomTokens);
        run.losses.push_back(r.loss);
        run.norms.push_back(r.grad_norm);
    }
    run.params = trainer.model().weights().params_to_host();
    return run;
}

// kSteps of cfg on the CPU and on the GPU give the same losses and first gradient norm (fp32
// within 1e-4, 16-bit within 2%) and, in fp32, parameters within 1e-3.
void require_same_training(const config::Config& cfg, bool fp32) {
    auto cpu = kernels::make_cpu_ops(1);
    auto gpu = kernels::make_cuda_ops(false);
    const Run on_cpu = train_steps(*cpu, cfg, kSteps), on_gpu = train_steps(*gpu, cfg, kSteps);
    const double tolerance = fp32 ? 1e-4 : 2e-2;
    // The first step's gradient norm comes before any update.
    CHECK(std::abs(on_gpu.norms[0] - on_cpu.norms[0]) <= tolerance * on_cpu.norms[0]);
    double worst = 0;  // the largest relative loss difference, printed for scripts/gpu_verify.sh
    for (std::size_t s = 0; s < on_cpu.losses.size(); ++s)
        worst = std::max(worst, std::abs(on_gpu.losses[s] - on_cpu.losses[s]) / on_cpu.losses[s]);
    std::printf("losses: %zu steps, worst relative difference %.3e (at most %.0e)\n",
                on_cpu.losses.size(), worst, tolerance);
    for (std::size_t s = 0; s < on_cpu.losses.size(); ++s) {
        INFO("step " << s + 1 << ": " << on_gpu.losses[s] << " on the GPU, " << on_cpu.losses[s]
                     << " on the CPU");
        CHECK(std::abs(on_gpu.losses[s] - on_cpu.losses[s]) <= tolerance * on_cpu.losses[s]);
    }
    // Adam normalises tiny gradients, so rounding noise in one can move a weight by up to lr a
    // step: the parameters agree less closely than the losses.
    if (fp32) CHECK(gpu_test::relative_error(on_gpu.params, on_cpu.params) <= 1e-3);
}

}  // namespace

TEST_CASE("cuda: whole training steps match the CPU backend", "[step]") {
    for (const char* precision : {"fp32", "bf16"}) {
        for (const char* recompute : {"none", "selective", "full"}) {
            // Without dropout, 16-bit attention runs on cuDNN where this cuDNN may; with it, on
            // the flash kernels.
            for (const char* dropout : {"0.1", "0"}) {
                INFO("precision " << precision << ", recompute " << recompute << ", dropout "
                                  << dropout);
                const config::Config cfg =
                    small_config({std::string("training.precision=") + precision,
                                  std::string("training.recompute=") + recompute,
                                  std::string("model.dropout=") + dropout,
                                  "training.fp32_grad_accumulation=true"});
                require_same_training(cfg, std::string(precision) == "fp32");
            }
        }
    }
}

// Llama's layer (RMSNorm, rotary positions, SwiGLU, 4 query heads sharing 2 key/value heads):
// its GPU kernels, with the RMSNorm weights' gradients in fp32 beside bf16 activations.
TEST_CASE("cuda: whole llama training steps match the CPU backend", "[step]") {
    for (const char* precision : {"fp32", "bf16"}) {
        for (const char* recompute : {"none", "full"}) {
            INFO("llama, precision " << precision << ", recompute " << recompute);
            require_same_training(small_config({"model.arch=llama", "model.kv_heads=2",
                                                std::string("training.precision=") + precision,
                                                std::string("training.recompute=") + recompute,
                                                "training.fp32_grad_accumulation=true"}),
                                  std::string(precision) == "fp32");
        }
    }
}

TEST_CASE("cuda: steps repeat bit for bit in fp32 (flash attention, no atomics)", "[step]") {
    const config::Config cfg = small_config({"training.precision=fp32"});
    auto gpu = kernels::make_cuda_ops(false);
    const Run first = train_steps(*gpu, cfg, 2), second = train_steps(*gpu, cfg, 2);
    REQUIRE(first.losses == second.losses);
    REQUIRE(first.params == second.params);
}

// The whole-matrix optimizers (optim/muon.h, optim/galore.h): their element work in the CUDA
// kernels, Muon's iterations in cuBLASLt GEMMs, GaLore's SVD and projections on the host; the
// bf16 iterations against the CPU's emulation of their rounding, as 16-bit runs are compared.
TEST_CASE("cuda: Muon and GaLore steps match the CPU backend", "[step]") {
    for (const char* optimizer : {"muon", "galore"}) {
        INFO(optimizer);
        require_same_training(
            small_config({std::string("optimizer.name=") + optimizer, "optimizer.galore.rank=8",
                          "optimizer.galore.update_gap=4"}),
            true);
    }
    INFO("muon, ns_dtype bf16");
    require_same_training(small_config({"optimizer.name=muon", "optimizer.muon.ns_dtype=bf16"}),
                          false);
}
