// The layout search (src/plan/search.h, `trident plan --search`) against the planner itself:
// every layout's memory is plan_memory's to the byte, every layout it lists loads as a config
// with its --set line, the fit filter and the ranking are what modelling every layout one by
// one gives, its lower bound is below every step time, and bad input is one line. The count of
// layouts against an independent enumeration is tests/python/test_plan_search.py's; the
// papers' layouts are tests/test_plan_papers.cpp's.
#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "cli_support.h"
#include "config/config.h"
#include "io/json_reader.h"
#include "plan/communication.h"
#include "plan/search.h"
#include "plan/search_memory.h"

namespace {

using namespace trident;

// Small models of each kind the memory and time models tell apart.
const char* const kGpt2 =
    "model: {vocab_size: 64, seq_len: 16, layers: 4, hidden: 32, heads: 4, ffn_hidden: 128, "
    "dropout: 0.1}\ntraining: {micro_batch: 2, global_batch: 8}\n";
const char* const kLlama =
    "model: {arch: llama, vocab_size: 64, seq_len: 16, layers: 4, hidden: 32, heads: 4, "
    "kv_heads: 2, ffn_hidden: 96}\ntraining: {micro_batch: 2, global_batch: 8, precision: "
    "bf16}\n";
const char* const kUlysses =
    "model: {vocab_size: 64, seq_len: 16, layers: 3, hidden: 32, heads: 8, ffn_hidden: 64}\n"
    "parallel: {context_mode: ulysses}\ntraining: {micro_batch: 1, global_batch: 4, "
    "precision: fp16}\n";
// A mixture of experts split over E = 4: only layouts with E dividing D·C and the shard group.
const char* const kExperts =
    "model: {arch: llama, vocab_size: 64, seq_len: 16, layers: 4, hidden: 32, heads: 4, "
    "kv_heads: 2, ffn_hidden: 96, moe: {experts: 4, top_k: 2, ffn_hidden: 32}}\n"
    "parallel: {data: 4, expert: 4}\ntraining: {micro_batch: 1, global_batch: 8}\n";
const char* const kAdapters =
    "model: {vocab_size: 64, seq_len: 16, layers: 2, hidden: 32, heads: 4, ffn_hidden: 64}\n"
    "training: {micro_batch: 1, global_batch: 4, lora: {rank: 2}}\n"
    "optimizer: {offload: host}\n";

config::Config base(const char* yaml) {
    return config::parse(yaml, "search.yaml", {}, config::Purpose::plan);
}

plan::PlanInputs inputs(const config::Config& cfg) {
    return plan::plan_inputs(
        cfg, plan::gradient_bytes(cfg.training.precision, cfg.training.fp32_grad_accumulation));
}

// Every layout the search considers for `gpus` GPUs, group by group.
std::vector<plan::Layout> layouts(const config::Config& cfg, int gpus) {
    plan::SearchSpace space;
    space.gpus = gpus;
    plan::Rejections rejected;
    std::vector<plan::Layout> out;
    plan::enumerate(
        cfg, space,
        [&](const plan::LayoutGroup& group) {
            for (const plan::Sharding& s : group.shardings) {
                plan::Layout l = group.layout;
                l.zero_stage = s.zero_stage;
                l.data_shard = s.data_shard;
                out.push_back(l);
            }
        },
        rejected);
    return out;
}

double largest_total(const std::vector<plan::StageMemory>& stages) {
    double most = 0;
    for (const plan::StageMemory& s : stages) most = std::max(most, s.total());
    return most;
}

plan::Hardware small_gpus() {
    plan::Hardware hw = plan::hardware_preset("dgx-h100");
    hw.gpus_per_node = 4;  // so that 8 GPUs are two nodes
    return hw;
}

}  // namespace

TEST_CASE("plan search: every layout's memory is plan_memory's, to the byte", "[plan][search]") {
    for (const auto& [yaml, gpus] :
         {std::pair{kGpt2, 8}, std::pair{kGpt2, 6}, std::pair{kLlama, 8}, std::pair{kUlysses, 8},
          std::pair{kAdapters, 4}, std::pair{kExperts, 8}}) {
        const config::Config cfg = base(yaml);
        plan::SearchMemory memory(cfg);
        plan::SearchSpace space;
        space.gpus = gpus;
        plan::Rejections rejected;
        int64_t compared = 0;
        plan::enumerate(
            cfg, space,
            [&](const plan::LayoutGroup& group) {
                const plan::GroupShape shape = memory.shape(group.layout);
                const plan::SearchMemory::Totals totals = memory.totals(group, shape);
                for (std::size_t k = 0; k < group.shardings.size(); ++k) {
                    plan::Layout l = group.layout;
                    l.zero_stage = group.shardings[k].zero_stage;
                    l.data_shard = group.shardings[k].data_shard;
                    const std::vector<plan::StageMemory> planned =
                        plan::plan_memory(inputs(plan::apply(cfg, l)));
                    INFO(plan::set_overrides(cfg, l).size()
                         << " keys set, P " << l.pipeline << " M " << l.tensor << " C " << l.context
                         << " D " << l.data);
                    REQUIRE(totals.most[k] == largest_total(planned));
                    const std::vector<double> parameters = totals.parameters(k);
                    for (std::size_t s = 0; s < planned.size(); ++s)
                        REQUIRE(parameters[s] == static_cast<double>(planned[s].parameters));
                    ++compared;
                }
            },
            rejected);
        INFO(yaml);
        CHECK(compared > 100);
    }
}

TEST_CASE("plan search: every layout loads with its --set line as the layout", "[plan][search]") {
    for (const auto& [yaml, gpus] : {std::pair{kGpt2, 8}, std::pair{kLlama, 4},
                                     std::pair{kUlysses, 8}, std::pair{kExperts, 8}}) {
        const config::Config cfg = base(yaml);
        for (const plan::Layout& l : layouts(cfg, gpus)) {
            const std::vector<std::string> sets = plan::set_overrides(cfg, l);
            const config::Config loaded =
                config::parse(yaml, "search.yaml", sets, config::Purpose::plan);
            config::Config expected = plan::apply(cfg, l);
            expected.warnings = loaded.warnings;
            REQUIRE(loaded == expected);
        }
    }
}

TEST_CASE("plan search: fit filter and ranking are every layout's, modelled one by one",
          "[plan][search]") {
    const plan::Hardware hw = small_gpus();
    for (const char* yaml : {kGpt2, kLlama}) {
        const config::Config cfg = base(yaml);
        struct Modelled {
            double memory, step;
        };
        std::vector<Modelled> all;
        for (const plan::Layout& l : layouts(cfg, 8)) {
            const plan::PlanInputs in = inputs(plan::apply(cfg, l));
            all.push_back({largest_total(plan::plan_memory(in)), plan::predict_step(in, hw).step});
        }
        // A device that holds about half of them.
        std::vector<double> memory;
        for (const Modelled& m : all) memory.push_back(m.memory);
        std::nth_element(memory.begin(), memory.begin() + memory.size() / 2, memory.end());
        plan::SearchOptions options;
        options.space.gpus = 8;
        options.space.gpus_per_node = hw.gpus_per_node;
        options.hardware = hw;
        options.device_memory = memory[memory.size() / 2];
        std::vector<double> fitting;
        for (const Modelled& m : all)
            if (m.memory <= options.device_memory) fitting.push_back(m.step);
        std::sort(fitting.begin(), fitting.end());
        for (const int top : {0, 7}) {
            options.top = top;
            const plan::SearchResult r = plan::search(cfg, options);
            CHECK(r.considered == static_cast<int64_t>(all.size()));
            CHECK(r.fit == static_cast<int64_t>(fitting.size()));
            CHECK(r.fit < r.considered);
            REQUIRE(r.best.size() == (top == 0 ? fitting.size() : static_cast<std::size_t>(top)));
            for (std::size_t i = 0; i < r.best.size(); ++i) {
                CHECK(r.best[i].time.step == fitting[i]);
                CHECK(r.best[i].memory <= options.device_memory);
            }
            if (top > 0) CHECK(r.modelled < r.fit);  // the bound spared the rest
        }
    }
}

TEST_CASE("plan search: the lower bound is below every layout's step time", "[plan][search]") {
    const plan::Hardware hw = small_gpus();
    for (const char* yaml : {kGpt2, kLlama, kUlysses}) {
        const config::Config cfg = base(yaml);
        for (const plan::Layout& l : layouts(cfg, 8)) {
            const plan::PlanInputs in = inputs(plan::apply(cfg, l));
            std::vector<plan::ChunkSeconds> compute;
            std::vector<double> parameters;
            const std::vector<plan::StageMemory> memory = plan::plan_memory(in);
            for (int s = 0; s < l.pipeline; ++s) {
                plan::ChunkSeconds stage;
                for (const plan::ChunkShape& c : plan::stage_chunks(in.cfg, s)) {
                    const plan::ChunkSeconds seconds = plan::chunk_seconds(in, c, hw);
                    stage.forward += seconds.forward;
                    stage.backward += seconds.backward;
                }
                compute.push_back(stage);
                parameters.push_back(
                    static_cast<double>(memory[static_cast<std::size_t>(s)].parameters));
            }
            plan::Layout unsharded = l;
            unsharded.zero_stage = 0;
            unsharded.data_shard = 0;
            const plan::PlanInputs in0 = inputs(plan::apply(cfg, unsharded));
            const std::vector<double> exchanges =
                plan::microbatch_exchange_seconds(in0, hw, plan::plan_traffic(in0));
            const double step = plan::predict_step(in, hw).step;
            const double bound = plan::step_lower_bound(in, hw, compute, parameters, exchanges);
            REQUIRE(bound <= step);
        }
    }
}

TEST_CASE("plan search: the command's pick plans to the byte as trident plan", "[plan][search]") {
    cli::Workspace ws;
    const std::string config = ws.write("gpt2.yaml", kGpt2);
    const auto search = cli::run("plan --config " + config +
                                 " --search --gpus 8 --hardware dgx-h100 --top 3 --json");
    INFO(search.output);
    REQUIRE(search.exit_code == 0);
    std::vector<io::json::Value> picks;
    for (std::size_t at = search.output.find("{\"rank\""); at != std::string::npos;
         at = search.output.find("{\"rank\"", at + 1))
        picks.push_back(
            io::json::parse(search.output.substr(at, search.output.find('\n', at) - at)));
    REQUIRE(picks.size() == 3);
    for (const io::json::Value& pick : picks) {
        std::string sets;
        for (const io::json::Value& s : pick.find("set")->array) sets += " --set " + s.string;
        const auto plan =
            cli::run("plan --config " + config + sets + " --hardware dgx-h100 --json");
        INFO(plan.output);
        REQUIRE(plan.exit_code == 0);
        const io::json::Value planned = io::json::parse(plan.output);
        int64_t most = 0;
        for (const io::json::Value& stage : planned.find("stages")->array)
            most = std::max(most, stage.find("memory_bytes")->find("total")->integer);
        CHECK(pick.find("memory_bytes")->integer == most);
        CHECK(pick.find("step_time")->find("step_s")->real ==
              planned.find("step_time")->find("step_s")->real);
    }
    CHECK(picks[0].find("why") != nullptr);
    const auto text =
        cli::run("plan --config " + config + " --search --gpus 8 --hardware dgx-h100");
    INFO(text.output);
    CHECK(text.output.find("layouts: ") != std::string::npos);
    CHECK(text.output.find("why: 1 ") != std::string::npos);
}

TEST_CASE("plan search: --doc-len ranks by the attention within documents", "[plan][search]") {
    // Documents of 4 tokens in windows of 16: every layout's step as plan_inputs with doc_len
    // models it (another than with whole windows), and the search's order is theirs.
    const plan::Hardware hw = small_gpus();
    const config::Config cfg =
        config::parse(std::string(kGpt2) + "data: {documents: mask, eod_token: 63}\n",
                      "search.yaml", {}, config::Purpose::plan);
    std::vector<double> steps;
    std::size_t changed = 0;
    for (const plan::Layout& l : layouts(cfg, 8)) {
        plan::PlanInputs in = inputs(plan::apply(cfg, l));
        const double whole = plan::predict_step(in, hw).step;
        in.doc_len = 4;
        steps.push_back(plan::predict_step(in, hw).step);
        changed += steps.back() != whole;
    }
    CHECK(changed == steps.size());
    std::sort(steps.begin(), steps.end());
    plan::SearchOptions options;
    options.space.gpus = 8;
    options.space.gpus_per_node = hw.gpus_per_node;
    options.hardware = hw;
    options.device_memory = 1e15;
    options.top = 5;
    options.doc_len = 4;
    const plan::SearchResult r = plan::search(cfg, options);
    REQUIRE(r.best.size() == 5);
    for (std::size_t i = 0; i < r.best.size(); ++i) CHECK(r.best[i].time.step == steps[i]);
    // The command lists what trident plan --doc-len predicts of its pick.
    cli::Workspace ws;
    const std::string config =
        ws.write("documents.yaml", std::string(kGpt2) + "data: {documents: mask, eod_token: 63}\n");
    const auto search = cli::run("plan --config " + config +
                                 " --search --gpus 8 --hardware dgx-h100 --top 1 --json "
                                 "--doc-len 4");
    INFO(search.output);
    REQUIRE(search.exit_code == 0);
    const std::size_t at = search.output.find("{\"rank\"");
    REQUIRE(at != std::string::npos);
    const io::json::Value pick =
        io::json::parse(search.output.substr(at, search.output.find('\n', at) - at));
    std::string sets;
    for (const io::json::Value& s : pick.find("set")->array) sets += " --set " + s.string;
    const auto plan =
        cli::run("plan --config " + config + sets + " --hardware dgx-h100 --json --doc-len 4");
    REQUIRE(plan.exit_code == 0);
    CHECK(pick.find("step_time")->find("step_s")->real ==
          io::json::parse(plan.output).find("step_time")->find("step_s")->real);
}

TEST_CASE("plan search: bad input is one line naming its cause", "[plan][search][bad-input]") {
    cli::Workspace ws;
    const std::string config = ws.write("gpt2.yaml", kGpt2);
    const std::string search = "plan --config " + config + " --hardware dgx-h100 --search";
    const auto one_line = [](const cli::RunResult& r, const std::string& expected) {
        cli::require_clear_error(r, expected);
        CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
    };
    one_line(cli::run(search), "--search needs --gpus N");
    one_line(cli::run(search + " --gpus 0"), "--search needs --gpus N");
    one_line(cli::run(search + " --gpus -2"), "--gpus: expected at least 1 GPU, got -2");
    // 7 GPUs: no split of 7 keeps a rule (4 layers, 4 heads, 16 tokens, 8 sequences).
    one_line(cli::run(search + " --gpus 7"), "--gpus 7: no layout of 7 GPUs keeps every rule");
    one_line(cli::run(search + " --gpus 4 --fix parallel.tensr=2"),
             "--fix parallel.tensr=2: unknown key 'parallel.tensr'");
    one_line(cli::run(search + " --gpus 4 --fix parallel.tensor=two"),
             "--fix parallel.tensor=two: expected a positive integer");
    one_line(cli::run(search + " --gpus 8 --fix parallel.tensor=8"),
             "--fix parallel.tensor=8: no layout of 8 GPUs keeps every rule with it "
             "(parallel.tensor must divide model.heads (4)");
    one_line(cli::run(search + " --gpus 4 --fix parallel.pipeline=4 --fix parallel.data=4"),
             "--fix parallel.pipeline=4 --fix parallel.data=4: no layout of 4 GPUs keeps every "
             "rule with all of them");
    one_line(cli::run(search + " --gpus 4 --device-memory 1KiB"),
             "no layout of 4 GPUs fits in 1.0 KiB");
    one_line(cli::run("plan --config " + config + " --search --gpus 4"),
             "--search ranks layouts by their predicted step time");
    one_line(cli::run("plan --config " + config +
                      " --search --gpus 4 --gemm-tflops 1 --mem-bw 1 "
                      "--intra-bw 1 --inter-bw 1"),
             "--search needs --device-memory");
    one_line(cli::run("plan --config " + config + " --gpus 4"), "--gpus is an option of --search");
    one_line(cli::run(search + " --gpus 4 --zero-stage 2"),
             "hold it with --fix parallel.zero_stage");
}
