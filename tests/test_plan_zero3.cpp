// The planner's ZeRO-3 on a pipeline against docs/FORMULAS.md: each unit's all-gathers a step
// and the weights gathered at once, with parallel.reshard_after_forward true and false.
#include <catch2/catch.hpp>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "plan/communication.h"
#include "plan/memory_model.h"

namespace {

using namespace trident;

plan::PlanInputs megatron_inputs(const std::vector<std::string>& overrides) {
    const config::Config cfg = config::load(TRIDENT_SOURCE_DIR "/configs/megatron-1.2b.yaml",
                                            overrides, config::Purpose::plan);
    return plan::plan_inputs(
        cfg, plan::gradient_bytes(cfg.training.precision, cfg.training.fp32_grad_accumulation));
}

}  // namespace

TEST_CASE("plan: ZeRO-3's gathers and gathered weights on a pipeline", "[plan]") {
    // docs/FORMULAS.md: resharding after every use, a layer is gathered 2m times a step (3m
    // when full recompute reruns its forward for a zero-bubble W), the first stage's wte and
    // wpe m times (only the embedding reads them), the last stage's ln_f and tied wte 2m;
    // kept, each unit once. Weights gathered at once: the two largest units (wte and a
    // layer), or the stage's whole buffer. 1.2B model (h 1536, 40 layers), P = 2, D = 4, m = 8.
    const double h = 1536, L = 20, V = 51200, s = 1024, D = 4;  // L: a stage's layers
    const double layer = 12 * h * h + 13 * h, wte = V * h, wpe = s * h, lnf = 2 * h;
    using parallel::CommKind;
    const auto gathers = [](const plan::GroupTraffic& g) {
        std::pair<int64_t, double> n{0, 0};
        for (const plan::Calls& c : g.calls)
            if (c.kind == CommKind::all_gather) {
                n.first += c.calls;
                n.second += static_cast<double>(c.calls) * c.elements;
            }
        return n;
    };
    for (const char* schedule : {"1f1b", "zb-h1"})
        for (const char* recompute : {"none", "full"})
            for (const bool reshard : {true, false}) {
                INFO(schedule << ", recompute " << recompute << ", reshard " << reshard);
                const plan::PlanInputs in = megatron_inputs(
                    {"parallel.pipeline=2", "parallel.data=4", "parallel.zero_stage=3",
                     "training.micro_batch=2", "training.global_batch=64",
                     "parallel.stage_layers=uniform", std::string("parallel.schedule=") + schedule,
                     std::string("training.recompute=") + recompute,
                     std::string("parallel.reshard_after_forward=") +
                         (reshard ? "true" : "false")});
                const config::Config& cfg = in.cfg;
                const double m = static_cast<double>(cfg.derived.grad_accum_steps);
                const double w = plan::weight_bytes(cfg.training.precision);
                REQUIRE(m == 8);
                const bool rerun = std::string(schedule) == "zb-h1" &&
                                   std::string(recompute) == "full";  // W reads weights
                const double per_layer = reshard ? m * (rerun ? 3 : 2) : 1;
                const double embedding = reshard ? m : 1;
                const double head = reshard ? m * (rerun ? 3 : 2) : 1;
                const std::vector<plan::StageTraffic> traffic = plan::plan_traffic(in);
                const auto [first_calls, first_elements] = gathers(traffic[0].data);
                CHECK(first_calls == L * per_layer + 2 * embedding);
                CHECK(first_elements == (L * per_layer * layer + embedding * (wte + wpe)) / D);
                const auto [last_calls, last_elements] = gathers(traffic[1].data);
                CHECK(last_calls == L * per_layer + 2 * head);
                CHECK(last_elements == (L * per_layer * layer + head * (lnf + wte)) / D);
                const std::vector<plan::StageMemory> memory = plan::plan_memory(in);
                for (const plan::StageMemory& stage : memory)
                    CHECK(stage.gathered == (reshard ? (wte + layer) * w
                                                     : static_cast<double>(stage.parameters) * w));
            }
}
