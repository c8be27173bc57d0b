// `trident plan --search`: the fastest layouts of a config on N GPUs that fit in their memory
// (src/plan/search.h), as a table or JSON lines. Bad input is one line naming its cause: no
// GPU count or one below 1, a count no layout reaches, a --fix key unknown or a value no
// layout can have, no layout that fits.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "commands/commands.h"
#include "commands/plan_options.h"
#include "commands/session.h"
#include "kernels/error.h"
#include "plan/search_report.h"
#include "train/metrics.h"

namespace trident::commands {

namespace {

plan::SearchOptions search_options(const PlanOptions& o) {
    if (o.gpus == 0) throw Error("--search needs --gpus N, the GPUs to lay the run out on");
    if (o.gpus < 1) throw Error("--gpus: expected at least 1 GPU, got " + std::to_string(o.gpus));
    if (o.top < -1) throw Error("--top: expected 0 (every layout that fits) or more");
    if (o.zero_stage != -1)
        throw Error(
            "--zero-stage: the search varies the ZeRO stage; hold it with --fix "
            "parallel.zero_stage=N");
    const std::optional<plan::Hardware> hw = plan_hardware(o);
    if (!hw)
        throw Error(
            "--search ranks layouts by their predicted step time: give --hardware (dgx2h-v100, "
            "dgx-a100, dgx-h100) or --gemm-tflops, --mem-bw, --intra-bw and --inter-bw");
    plan::SearchOptions s;
    s.hardware = *hw;
    s.space.gpus = o.gpus;
    s.space.gpus_per_node = hw->gpus_per_node;
    s.space.cross_node_tensor = o.allow_cross_node_tp;
    for (const std::string& f : o.fixes) s.space.fixes.add(f);
    s.top = o.top == -1 ? 10 : o.top;
    if (!o.device_memory.empty())
        s.device_memory = parse_size(o.device_memory);
    else if (hw->memory_bytes > 0)
        s.device_memory = hw->memory_bytes;
    else
        throw Error("--search needs --device-memory: the rates given name no GPU, nor its memory");
    return s;
}

// The rules that ruled out the most, most first.
std::string rules_text(const plan::Rejections& rejected) {
    std::vector<std::pair<int64_t, std::string>> rules;
    for (const auto& [rule, count] : rejected) rules.emplace_back(-count, rule);
    std::sort(rules.begin(), rules.end());
    std::string out;
    for (std::size_t i = 0; i < rules.size() && i < 3; ++i)
        out += (i ? "; " : "") + rules[i].second;
    return out.empty() ? "none to choose from" : out;
}

// Why no layout kept the rules: the GPU count, or a --fix (alone, or with the others).
[[noreturn]] void no_layout(const config::Config& cfg, const plan::SearchOptions& o,
                            const plan::Rejections& rejected) {
    const std::string gpus = std::to_string(o.space.gpus);
    if (o.space.fixes.empty())
        throw Error("--gpus " + gpus + ": no layout of " + gpus + " GPUs keeps every rule for " +
                    cfg.source + " (" + rules_text(rejected) + ")");
    for (const std::string& fix : o.space.fixes.given()) {
        plan::SearchSpace alone = o.space;
        alone.fixes = {};
        alone.fixes.add(fix);
        plan::Rejections why;
        bool any = false;
        plan::enumerate(
            cfg, alone, [&](const plan::LayoutGroup&) { any = true; }, why);
        if (!any)
            throw Error("--fix " + fix + ": no layout of " + gpus +
                        " GPUs keeps every rule with it (" + rules_text(why) + ")");
    }
    throw Error(o.space.fixes.text() + ": no layout of " + gpus +
                " GPUs keeps every rule with all of them (" + rules_text(rejected) + ")");
}

}  // namespace

int plan_search(const PlanOptions& opts) {
    plan::SearchOptions options = search_options(opts);
    const config::Config cfg = config::load(opts.config, opts.overrides, config::Purpose::plan);
    options.doc_len = document_length(cfg, opts.doc_len);
    print_warnings(cfg);
    warn_lora(cfg);
    const auto start = std::chrono::steady_clock::now();
    const plan::SearchResult result = plan::search(cfg, options);
    if (result.considered == 0) no_layout(cfg, options, result.rejected);
    if (result.fit == 0)
        throw Error("no layout of " + std::to_string(options.space.gpus) + " GPUs fits in " +
                    train::human_bytes(options.device_memory) + ": of the " +
                    std::to_string(result.considered) +
                    " that keep every rule the smallest needs " +
                    train::human_bytes(result.smallest.memory) + " (" +
                    plan::set_line(cfg, result.smallest.layout) + ")");
    plan::SearchReport report{cfg, options, result, {}, 0};
    const int grad_bytes =
        plan::gradient_bytes(cfg.training.precision, cfg.training.fp32_grad_accumulation);
    for (const plan::Ranked& r : result.best) {
        plan::PlanInputs inputs = plan::plan_inputs(plan::apply(cfg, r.layout), grad_bytes);
        inputs.doc_len = options.doc_len;
        report.plans.push_back(plan::make_plan(inputs, options.hardware, options.device_memory));
    }
    report.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (opts.json) {
        std::fputs(plan::search_summary(report).c_str(), stderr);
        std::fputs(plan::render_search_json(report).c_str(), stdout);
    } else {
        std::fputs(plan::render_search_text(report).c_str(), stdout);
    }
    return 0;
}

}  // namespace trident::commands
