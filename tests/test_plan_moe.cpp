// The planner's counts of a mixture of experts against docs/FORMULAS.md: parameters total and
// active per token of Mixtral-8x7B and 8x22B and Qwen3-30B-A3B (configs/), the model FLOPs of the
// active experts only, one rank's GEMM FLOPs of an MoE layer under a tensor split, expert
// parallelism's all-to-alls per stage and step, and a rank's model states with the experts split.
#include <catch2/catch.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "config/config.h"
#include "config/model_shape.h"
#include "model/flops.h"
#include "plan/communication.h"
#include "plan/memory_model.h"
#include "plan/perf_model.h"

namespace {

using namespace trident;

config::Config load(const std::string& file, const std::vector<std::string>& overrides = {}) {
    return config::load(TRIDENT_SOURCE_DIR "/configs/" + file, overrides, config::Purpose::plan);
}

}  // namespace

TEST_CASE("plan: parameters of Mixtral-8x7B and 8x22B, total and active", "[plan][moe]") {
    // Mixtral-8x7B: Hugging Face's mistralai/Mixtral-8x7B-v0.1, the figures Mistral states.
    const config::Config small = load("mixtral-8x7b.yaml");
    CHECK(small.derived.parameters == 46'702'792'704);
    CHECK(small.derived.active_parameters == 12'879'925'248);
    // Mixtral-8x22B, vocabulary 32768: docs/FORMULAS.md's Ψ_moe, L·(2h² + 2h·kv + N·h +
    // 3h·N·F + 2h) + 2·V·h + h, and its active part, Ψ − L·(N − k)·3h·F.
    const config::Config large = load("mixtral-8x22b.yaml");
    const int64_t h = 6144, kv = 1024, F = 16384, N = 8, k = 2, L = 56, V = 32768;
    const int64_t total =
        L * (2 * h * h + 2 * h * kv + N * h + 3 * h * N * F + 2 * h) + 2 * V * h + h;
    CHECK(total == 140'630'071'296);  // the model card's 141B
    CHECK(large.derived.parameters == total);
    CHECK(large.derived.active_parameters == total - L * (N - k) * 3 * h * F);  // its 39B
}

TEST_CASE("plan: parameters of Qwen3-30B-A3B, total and active", "[plan][moe]") {
    // Hugging Face's Qwen/Qwen3-30B-A3B: heads of head_dim d = 128, so the attention is
    // a = NH·d = 4096 wide against h = 2048; q and o a·h each, k and v kv·h (kv = 4·128), the
    // q and k norms d each, 128 experts of width 768 and the router N·h; Qwen's 30.5B, 3.3B
    // active.
    const config::Config cfg = load("qwen3-30b-a3b.yaml");
    const int64_t h = 2048, a = 4096, kv = 512, d = 128, F = 768, N = 128, k = 8, L = 48,
                  V = 151936;
    const int64_t total =
        L * (2 * a * h + 2 * kv * h + 2 * d + N * h + 3 * h * N * F + 2 * h) + 2 * V * h + h;
    CHECK(total == 30'532'122'624);
    CHECK(cfg.derived.parameters == total);
    CHECK(cfg.derived.active_parameters == total - L * (N - k) * 3 * h * F);
    CHECK(cfg.derived.active_parameters == 3'353'032'704);
}

TEST_CASE("plan: an MoE model's FLOPs count only the active experts", "[plan][moe]") {
    // docs/FORMULAS.md: 3 × (2·B·s·(L·(2h² + 2h·kv + N·h + (k + S)·3h·F_e) + V·h) + 2·B·s²·L·h).
    const config::Config cfg = load("mixtral-8x7b.yaml");
    const double B = 512, s = 4096, L = 32, h = 4096, kv = 1024, F = 14336, N = 8, k = 2, V = 32000;
    const double weights = L * (2 * h * h + 2 * h * kv + N * h + k * 3 * h * F) + V * h;
    const double expected = 3 * (2 * B * s * weights + 2 * B * s * s * L * h);
    CHECK(cfg.derived.flops_per_step == Approx(expected).epsilon(1e-12));
    // A shared expert computes on every token: one more expert's width.
    const config::Config shared = load("mixtral-8x7b.yaml", {"model.moe.shared_experts=1"});
    CHECK(shared.derived.flops_per_step - cfg.derived.flops_per_step ==
          Approx(3 * 2 * B * s * L * 3 * h * F).epsilon(1e-12));
}

TEST_CASE("plan: one rank's GEMM FLOPs of an MoE layer under a tensor split", "[plan][moe]") {
    // configs/moe-small-cpu.yaml at M = 2: the rows of a microbatch, n = 16·128, through the
    // attention's linears (q and o h×h/M, k and v kv×h/M), the whole router (N×h), the k
    // routed experts' and the shared expert's gate, up and down (3·h·F/M each), and the
    // causal scores' two products (B·s²·h/M each).
    const config::Config cfg = load("moe-small-cpu.yaml", {"parallel.tensor=2"});
    const model::GemmFlops f = model::gemm_flops(model::resolve_spec(config::gpt_shape(cfg)),
                                                 config::rank_dims(cfg), cfg.training.recompute);
    const double n = 16 * 128, B = 16, s = 128, h = 256, kv = 128, F = 256, N = 8, k = 2, M = 2;
    const double linears = 2 * n * ((2 * h * h + 2 * kv * h) / M + N * h + (k + 1) * 3 * h * F / M);
    CHECK(f.layer_forward == Approx(linears + 2 * B * s * s * h / M).epsilon(1e-12));
    CHECK(f.layer_weight == Approx(linears).epsilon(1e-12));
}

TEST_CASE("plan: expert parallelism's all-to-alls per stage", "[plan][moe]") {
    // Mixtral-8x7B on its 4 x 8 x 1 x 2 grid with E = 2, bf16: per MoE layer and microbatch
    // f all-to-alls of the 8 experts' i32 counts and 2·(f + 1) of the K = k·n rows of h
    // activations, n = 4096 rows a rank (docs/FORMULAS.md); f = 2 under its full recompute,
    // 1 without (which a dense first layer needs). Each stage holds 8 of the 32
    // layers; with first_dense 1 stage 0 holds 7 MoE layers.
    for (const auto& [first_dense, recompute, f] :
         {std::tuple{0, "full", 2.0}, std::tuple{1, "none", 1.0}}) {
        INFO("first_dense " << first_dense << ", recompute " << recompute);
        const config::Config cfg =
            load("mixtral-8x7b.yaml",
                 {"parallel.expert=2", std::string("training.recompute=") + recompute,
                  "model.moe.first_dense=" + std::to_string(first_dense)});
        const plan::PlanInputs in = plan::plan_inputs(cfg, 4);
        const std::vector<plan::StageTraffic> traffic = plan::plan_traffic(in);
        const double m = 256, N = 8, K = 2 * 4096.0, h = 4096, w = 2;
        for (std::size_t s = 0; s < traffic.size(); ++s) {
            const double layers = s == 0 ? 8 - first_dense : 8;
            const plan::GroupTraffic& g = traffic[s].expert;
            CHECK(g.size == 2);
            CHECK(g.call_count() == static_cast<int64_t>(m * layers * (f + 2 * (f + 1))));
            CHECK(g.payload_bytes() == m * layers * (f * 4 * N + 2 * (f + 1) * K * h * w));
            CHECK(g.sent_bytes() == g.payload_bytes() / 2);  // (E - 1)/E leaves the rank
        }
        // On the critical path: the step's expert share is the slowest stage's all-to-alls.
        const plan::StepTime t = plan::predict_step(in, plan::hardware_preset("dgx-h100"));
        CHECK(t.expert_comm > 0);
        CHECK(t.step == Approx(t.compute + t.tensor_comm + t.context_comm + t.expert_comm +
                               t.pipeline_comm + t.bubble + t.data_comm + t.optimizer)
                            .epsilon(1e-12));
    }
    // Without expert parallelism, nothing moves in that group.
    const config::Config dense = load("mixtral-8x7b.yaml");
    for (const plan::StageTraffic& t : plan::plan_traffic(plan::plan_inputs(dense, 4)))
        CHECK(t.expert.calls.empty());
}

TEST_CASE("plan: a rank's model states with Mixtral-8x7B's experts split over E = 8",
          "[plan][moe]") {
    // Its 4 x 8 x 1 x 8 grid, ZeRO-1 (docs/ARCHITECTURE.md, "Mixture of experts"): stage 0
    // holds the embedding's Vp/M rows (Vp = 32768, a multiple of 128·M) and 8 layers; tensor
    // rank 0 of a layer two norms, q and o (h/M × h each), one key/value head's k and v
    // (128 × h each), the router (N × h) and, of the N experts, N/E: gate and up (F/M × h) and
    // down (h × F/M). Every run is a multiple of D·C = 8 already: no padding.
    const double h = 4096, F = 14336, M = 8, N = 8, Vp = 32768;
    const double dense_layer = 2 * h + 2 * (h / M) * h + 2 * 128 * h + N * h;
    const double expert = 3 * (F / M) * h;
    const double embedding = Vp / M * h;
    for (const int E : {1, 8}) {
        INFO("parallel.expert " << E);
        const config::Config cfg =
            load("mixtral-8x7b.yaml", {"parallel.data=8", "parallel.expert=" + std::to_string(E)});
        const plan::PlanInputs in = plan::plan_inputs(cfg, 4);
        const plan::StageMemory s = plan::stage_states(in, plan::stage_layout(in, 0));
        const double experts = 8 * (N / E) * expert;  // held by the rank, of its 8 layers
        const double dense = embedding + 8 * dense_layer;
        CHECK(s.parameters == static_cast<int64_t>(dense + experts));
        CHECK(s.states.weights == 2 * (dense + experts));    // bf16
        CHECK(s.states.gradients == 4 * (dense + experts));  // fp32 (plan_inputs' 4)
        // 12 bytes (fp32 master, Adam's m and v) of a D·C-th of the rest, and of a
        // (D·C/E)-th of the experts held: what one process holds of them, over D·C.
        CHECK(s.states.optimizer == Approx(12 * (dense / 8 + experts / (8.0 / E))).epsilon(1e-12));
    }
}
