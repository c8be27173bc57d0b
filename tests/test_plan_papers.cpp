// The layout search (`trident plan --search`, src/plan/search.h) against the layouts the
// papers ran, as docs/PERF.md ("The search against the papers' layouts") tabulates them: for
// every row of PTD-P's Table 1 (Narayanan et al. 2021, arXiv 2104.04473) on A100-80GB and of
// Megatron-LM 2019's weak-scaling series (Shoeybi et al., arXiv 1909.08053) on DGX-2H, the
// paper's layout keeps the search's rules and fits, and the search's best is at least as fast
// by the planner's model. How much faster, and why, is printed for docs/PERF.md.
#include <catch2/catch.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "config/config.h"
#include "plan/search.h"
#include "plan/search_report.h"

namespace {

using namespace trident;

// The paper's layout: its grid, 1F1B, full recompute, plain data parallelism, no sequence
// parallelism (which came later), as configs/ptdp-1t.yaml and configs/megatron-*.yaml run it.
plan::Layout paper_layout(const config::Config& cfg) {
    const auto& p = cfg.parallel;
    return {p.pipeline,
            p.tensor,
            1,
            p.data,
            pipeline::Kind::one_f_one_b,
            1,
            cfg.training.micro_batch,
            0,
            0,
            false,
            false,
            config::Recompute::full};
}

// Searches the config's GPUs on `hardware` and holds the paper's layout against the best.
void check_paper(const config::Config& cfg, const std::string& row, const char* hardware) {
    const plan::Layout paper = paper_layout(cfg);
    REQUIRE(plan::apply(cfg, paper) == cfg);
    plan::SearchOptions options;
    options.hardware = plan::hardware_preset(hardware);
    options.device_memory = options.hardware.memory_bytes;
    options.space.gpus = cfg.derived.world_size;
    options.space.gpus_per_node = options.hardware.gpus_per_node;
    options.top = 1;
    const plan::PlanInputs in = plan::plan_inputs(
        cfg, plan::gradient_bytes(cfg.training.precision, cfg.training.fp32_grad_accumulation));
    const plan::StepTime paper_time = plan::predict_step(in, options.hardware);
    const double paper_step = paper_time.step;

    // Among the layouts that keep the rules and fit: held at every key, it is the one found.
    plan::SearchOptions held = options;
    for (const std::string& assignment : plan::key_values(paper)) held.space.fixes.add(assignment);
    const plan::SearchResult alone = plan::search(cfg, held);
    INFO(row << ": the paper's layout held by " << held.space.fixes.text());
    REQUIRE(alone.fit == 1);
    REQUIRE(alone.best.front().layout == paper);
    CHECK(alone.best.front().time.step == paper_step);

    const plan::SearchResult r = plan::search(cfg, options);
    REQUIRE(!r.best.empty());
    const plan::Ranked& best = r.best.front();
    const double gain = paper_step / best.time.step;
    std::printf("%s: the paper's layout %.4g s a step; the search's best %.4g s (%.3gx), %s\n",
                row.c_str(), paper_step, best.time.step, gain,
                plan::set_line(cfg, best.layout).c_str());
    const plan::StepTime& t = best.time;
    std::printf(
        "  paper against best: compute %.4g / %.4g, tensor %.4g / %.4g, context %.4g / "
        "%.4g, bubble %.4g / %.4g, data %.4g / %.4g, optimizer %.4g / %.4g s\n",
        paper_time.compute, t.compute, paper_time.tensor_comm, t.tensor_comm,
        paper_time.context_comm, t.context_comm, paper_time.bubble, t.bubble, paper_time.data_comm,
        t.data_comm, paper_time.optimizer, t.optimizer);
    CHECK(best.time.step <= paper_step);
}

}  // namespace

// PTD-P Table 1: parameters (billions), heads, hidden, layers, tensor, pipeline, data, batch.
struct PtdpRow {
    const char* billions;
    int heads, hidden, layers, tensor, pipeline, data, batch;
};
constexpr PtdpRow kPtdp[] = {
    {"1.7", 24, 2304, 24, 1, 1, 32, 512},       {"3.6", 32, 3072, 30, 2, 1, 32, 512},
    {"7.5", 32, 4096, 36, 4, 1, 32, 512},       {"18.4", 48, 6144, 40, 8, 1, 32, 1024},
    {"39.1", 64, 8192, 48, 8, 2, 32, 1536},     {"76.1", 80, 10240, 60, 8, 4, 32, 1792},
    {"145.6", 96, 12288, 80, 8, 8, 24, 2304},   {"310.1", 128, 16384, 96, 8, 16, 15, 2160},
    {"529.6", 128, 20480, 105, 8, 35, 9, 2520}, {"1008", 160, 25600, 128, 8, 64, 6, 3072}};

void check_ptdp(std::size_t first, std::size_t last) {
    for (std::size_t i = first; i <= last; ++i) {
        const PtdpRow& r = kPtdp[i];
        const auto n = [](int v) { return std::to_string(v); };
        const config::Config cfg =
            config::load(TRIDENT_SOURCE_DIR "/configs/ptdp-1t.yaml",
                         {"model.heads=" + n(r.heads), "model.hidden=" + n(r.hidden),
                          "model.ffn_hidden=" + n(4 * r.hidden), "model.layers=" + n(r.layers),
                          "parallel.tensor=" + n(r.tensor), "parallel.pipeline=" + n(r.pipeline),
                          "parallel.data=" + n(r.data), "training.global_batch=" + n(r.batch)},
                         config::Purpose::plan);
        check_paper(cfg,
                    std::string("PTD-P ") + r.billions + "B on " +
                        std::to_string(cfg.derived.world_size) + " A100s",
                    "dgx-a100");
    }
}

TEST_CASE("plan search: PTD-P Table 1, 1.7B to 18.4B, finds the paper's layout or better",
          "[plan][search][papers]") {
    check_ptdp(0, 3);
}

TEST_CASE("plan search: PTD-P Table 1, 39.1B to 145.6B, finds the paper's layout or better",
          "[plan][search][papers]") {
    check_ptdp(4, 6);
}

TEST_CASE("plan search: PTD-P Table 1, 310.1B and 529.6B, finds the paper's layout or better",
          "[plan][search][papers]") {
    check_ptdp(7, 8);
}

TEST_CASE("plan search: PTD-P Table 1, 1008B on 3072 GPUs, finds the paper's layout or better",
          "[plan][search][papers]") {
    check_ptdp(9, 9);
}

TEST_CASE("plan search: Megatron-LM 2019's series finds the paper's layouts or better",
          "[plan][search][papers]") {
    // Model parallel alone with batch 8, and with 64 replicas at global batch 512.
    for (const char* size : {"1.2b", "2.5b", "4.2b", "8.3b"})
        for (const bool replicas : {false, true}) {
            const std::vector<std::string> data = {"parallel.data=64", "training.global_batch=512"};
            const config::Config cfg =
                config::load(TRIDENT_SOURCE_DIR "/configs/megatron-" + std::string(size) + ".yaml",
                             replicas ? data : std::vector<std::string>{}, config::Purpose::plan);
            check_paper(cfg,
                        std::string("Megatron-LM 2019 ") + size + " on " +
                            std::to_string(cfg.derived.world_size) + " V100s",
                        "dgx2h-v100");
        }
}
