// QLoRA's memory claim checked by the planner (docs/PERF.md, "QLoRA's 65B on one GPU"):
// LLaMA 65B and Llama-2 70B (configs/llama-65b-qlora.yaml, configs/llama2-70b-qlora.yaml) with
// the 4-bit base's codes and constants counted to the byte from the format (kernels/nf4.h:
// 0.5 + 1/64 + 4/(64·256) bytes a parameter, and each matrix's mean and last part-filled
// second-level block), the adapters' states, and the whole on one 48 GiB GPU; and the paper's
// "more than 780 GB" for 16-bit fine-tuning of the 65B.
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "config/config.h"
#include "plan/memory_model.h"

namespace {

using namespace trident;

config::Config load(const std::string& file, const std::vector<std::string>& overrides = {}) {
    return config::load(TRIDENT_SOURCE_DIR "/configs/" + file, overrides, config::Purpose::plan);
}

plan::StageMemory stage_of(const config::Config& cfg) {
    return plan::plan_memory(
               plan::plan_inputs(cfg, plan::gradient_bytes(cfg.training.precision,
                                                           cfg.training.fp32_grad_accumulation)))
        .front();
}

// The bytes of one matrix of n parameters in blocks of 64 with double quantization.
double nf4_bytes(double n) {
    const double blocks = n / 64;
    return n / 2 + blocks + 4 * std::ceil(blocks / 256) + 4;
}

constexpr double kGiB = 1024.0 * 1024 * 1024;

}  // namespace

TEST_CASE("plan: QLoRA's 65B and Llama-2 70B on one 48 GiB GPU, the 4-bit base to the byte",
          "[plan][qlora]") {
    struct Row {
        const char* config;
        double F, kv;       // SwiGLU width, key/value width (kv_heads · 128)
        double parameters;  // Hugging Face's configs' count
    };
    const Row rows[] = {{"llama-65b-qlora.yaml", 22016, 8192, 65'285'660'672.0},
                        {"llama2-70b-qlora.yaml", 28672, 1024, 68'976'648'192.0}};
    const double h = 8192, L = 80, V = 32000, r = 64;
    for (const Row& row : rows) {
        INFO(row.config);
        const config::Config cfg = load(row.config);
        CHECK(static_cast<double>(cfg.derived.parameters) == row.parameters);
        const plan::StageMemory stage = stage_of(cfg);
        // The base: each layer's q and o (h × h), k and v (kv × h), gate and up (F × h) and
        // down (h × F) in 4 bits; 4.127 bits a parameter, the means and part-filled blocks aside.
        const double matrices = L * (2 * h * h + 2 * row.kv * h + 3 * row.F * h);
        const double base =
            L * (2 * nf4_bytes(h * h) + 2 * nf4_bytes(row.kv * h) + 3 * nf4_bytes(row.F * h));
        CHECK(8 * base / matrices == Approx(8 * (0.5 + 1.0 / 64 + 4.0 / (64 * 256))).epsilon(1e-6));
        // In bf16 beside it: the embedding, the head, the norms, the tile the longest run of
        // adjacent matrices is dequantized into (gate, up and down), and the adapters, r·(in +
        // out) a target; the adapters' gradients fp32, their master weights and moments in host
        // memory (optimizer.offload: host).
        const double dense = 2 * V * h + (2 * L + 1) * h, tile = 3 * row.F * h;
        const double adapters = L * r * (2 * (h + h) + 2 * (h + row.kv) + 3 * (h + row.F));
        CHECK(stage.states.weights == base + 2 * (dense + tile + adapters));
        CHECK(stage.states.gradients == 4 * adapters);
        CHECK(stage.offloaded == 12 * adapters);
        CHECK(stage.states.optimizer == 0);
        std::printf("%s: base %.2f GiB (%.4f bits a parameter), weights %.2f GiB, total %.2f GiB\n",
                    row.config, base / kGiB, 8 * base / matrices, stage.states.weights / kGiB,
                    stage.total() / kGiB);
        CHECK(stage.total() < 48 * kGiB);
        // With the optimizer's state on the GPU too (no paging), it does not fit.
        CHECK(stage_of(load(row.config, {"optimizer.offload=none"})).total() > 48 * kGiB);
    }
    // "More than 780 GB" to fine-tune the 65B in 16 bits: every parameter trained in bf16
    // (bf16 weights, fp32 gradients, fp32 master weights and AdamW's moments), full recompute.
    const config::Config full =
        load("llama-65b-qlora.yaml", {"training.lora.quantize=none", "training.lora.rank=0",
                                      "model.init_from=null", "optimizer.offload=none"});
    const plan::StageMemory dense = stage_of(full);
    std::printf("llama-65b 16-bit fine-tuning: %.0f GB\n", dense.total() / 1e9);
    CHECK(dense.total() > 780e9);
}
