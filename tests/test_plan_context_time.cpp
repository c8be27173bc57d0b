// The planner's step time charges context parallelism's exchanges (src/plan/perf_model.h): ring
// attention's sends between neighbours at a link's latency and bandwidth (NVLink inside a node,
// the network across), Ulysses' all-to-alls as collectives of (C − 1)/C of their payload, none
// hidden under the attention, every microbatch's. The expected seconds are formed here from the
// traffic plan_traffic counts (tests/test_plan.cpp holds that to the runtime's calls).
#include <catch2/catch.hpp>
#include <vector>

#include "config/config.h"
#include "plan/communication.h"
#include "plan/perf_model.h"

namespace {

using namespace trident;

plan::PlanInputs context_inputs(const char* mode) {
    const config::Config cfg = config::parse(
        "model: {vocab_size: 64, seq_len: 16, layers: 2, hidden: 32, heads: 4, ffn_hidden: 64}\n"
        "parallel: {context: 2, data: 2}\ntraining: {micro_batch: 1, global_batch: 4}\n",
        "context.yaml", {std::string("parallel.context_mode=") + mode}, config::Purpose::plan);
    return plan::plan_inputs(cfg, plan::gradient_bytes(cfg.training.precision, false));
}

plan::Hardware rates(int per_node) {
    plan::Hardware hw;
    hw.name = "test";
    hw.gemm_flops = 1e12;
    hw.memory_bandwidth = 1e11;
    hw.intra_bandwidth = 1e9;
    hw.inter_bandwidth = 1e8;
    hw.gpus_per_node = per_node;
    hw.latency = 7e-6;
    return hw;
}

// What the context group's calls of one step cost, each formed from its kind.
double expected_seconds(const plan::GroupTraffic& g, const plan::Hardware& hw, bool one_node) {
    const double bandwidth = one_node ? hw.intra_bandwidth : hw.inter_bandwidth;
    double seconds = 0;
    for (const plan::Calls& c : g.calls) {
        const double payload = c.elements * c.element_bytes;
        REQUIRE(c.per_microbatch);
        const double one = c.kind == parallel::CommKind::send
                               ? hw.latency + payload / bandwidth
                               : hw.latency + (g.size - 1.0) / g.size * payload / bandwidth;
        seconds += static_cast<double>(c.calls) * one;
    }
    return seconds;
}

}  // namespace

TEST_CASE("plan: context-parallel exchanges are on the step's critical path", "[plan]") {
    for (const char* mode : {"ring", "ulysses"}) {
        const plan::PlanInputs in = context_inputs(mode);
        const std::vector<plan::StageTraffic> traffic = plan::plan_traffic(in);
        const plan::GroupTraffic& context = traffic.front().context;
        REQUIRE(context.size == 2);
        REQUIRE(!context.calls.empty());
        // 4 GPUs a node: the context pair is in one; 1 a node: every exchange crosses the
        // network (Ulysses' all-to-all of 2 ranks as 2 nodes of 1).
        for (const int per_node : {4, 1}) {
            INFO(mode << ", " << per_node << " GPUs a node");
            const plan::Hardware hw = rates(per_node);
            const plan::StepTime t = plan::predict_step(in, hw);
            const double expected = expected_seconds(context, hw, per_node > 1);
            CHECK(t.context_comm == Approx(expected).epsilon(1e-12));
            CHECK(t.context_comm > 0);
            CHECK(t.step == Approx(t.compute + t.tensor_comm + t.context_comm + t.pipeline_comm +
                                   t.bubble + t.data_comm + t.optimizer)
                                .epsilon(1e-12));
        }
    }
}
