// `trident plan`: what a config will need before it runs — memory per rank, FLOPs and
// communication per step, and on given hardware the step time — computed from the config
// alone (src/plan/). The config is checked as `train` checks it, except for what only this
// build's runtime lacks (a GPU, 16-bit precision): plans are for any hardware.
#include <cctype>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>

#include "commands/commands.h"
#include "commands/plan_options.h"
#include "commands/session.h"
#include "config/config.h"
#include "kernels/error.h"
#include "plan/report.h"

namespace trident::commands {

double parse_size(const std::string& text) {
    std::size_t end = 0;
    double value = 0;
    try {
        value = std::stod(text, &end);
    } catch (const std::exception&) {
        end = 0;
    }
    std::string unit = text.substr(end);
    while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.front())))
        unit.erase(0, 1);
    const std::pair<const char*, double> units[] = {
        {"", 1},      {"B", 1},        {"KB", 1e3},     {"MB", 1e6},     {"GB", 1e9},
        {"TB", 1e12}, {"KiB", 0x1p10}, {"MiB", 0x1p20}, {"GiB", 0x1p30}, {"TiB", 0x1p40}};
    if (end > 0 && value > 0 && std::isfinite(value))
        for (const auto& [name, scale] : units)
            if (unit == name) return value * scale;
    throw Error("--device-memory: expected a size such as 80GiB or 40GB, got '" + text + "'");
}

namespace {

// The figures given: each a finite number, a rate positive (0 leaves the preset's, and a
// negative latency too). NaN or infinity would print "-nan s per step" with exit code 0.
void check_figures(const PlanOptions& o) {
    const std::pair<const char*, double> rates[] = {
        {"--gemm-tflops", o.gemm_tflops}, {"--mem-bw", o.mem_bw},   {"--intra-bw", o.intra_bw},
        {"--inter-bw", o.inter_bw},       {"--disk-bw", o.disk_bw}, {"--latency-us", o.latency_us}};
    for (const auto& [option, value] : rates) {
        const bool latency = std::string_view(option) == "--latency-us";
        if (std::isfinite(value) && (value >= 0 || latency)) continue;
        char given[32];
        std::snprintf(given, sizeof given, "%g", value);
        throw Error(std::string(option) + ": expected a finite " +
                    (latency ? "number" : "positive figure") + ", got " + given);
    }
}

}  // namespace

std::optional<plan::Hardware> plan_hardware(const PlanOptions& o) {
    check_figures(o);
    const bool any_figure = o.gemm_tflops > 0 || o.mem_bw > 0 || o.intra_bw > 0 || o.inter_bw > 0;
    if (o.hardware.empty() && !any_figure) return std::nullopt;
    plan::Hardware hw;
    if (!o.hardware.empty()) {
        hw = plan::hardware_preset(o.hardware);
    } else {
        if (o.gemm_tflops <= 0 || o.mem_bw <= 0 || o.intra_bw <= 0 || o.inter_bw <= 0)
            throw Error(
                "without --hardware, give all of --gemm-tflops, --mem-bw, --intra-bw and "
                "--inter-bw (positive)");
        hw.name = "custom";
        hw.latency = 20e-6;
    }
    if (o.gemm_tflops > 0) hw.gemm_flops = o.gemm_tflops * 1e12;
    if (o.mem_bw > 0) hw.memory_bandwidth = o.mem_bw * 1e9;
    if (o.intra_bw > 0) hw.intra_bandwidth = o.intra_bw * 1e9;
    if (o.inter_bw > 0) hw.inter_bandwidth = o.inter_bw * 1e9;
    if (o.gpus_per_node > 0) hw.gpus_per_node = o.gpus_per_node;
    if (o.latency_us >= 0) hw.latency = o.latency_us * 1e-6;
    if (o.disk_bw > 0) hw.disk_bandwidth = o.disk_bw * 1e9;
    return hw;
}

void warn_lora(const config::Config& cfg) {
    if (cfg.training.lora.enabled())
        std::fprintf(stderr,
                     "trident: warning: training.lora is modelled in its memory (the frozen "
                     "weights, the adapters' weights, gradients, optimizer state and "
                     "activations); communication and time are those of training the whole "
                     "model, an upper bound on the adapters' run\n");
}

int document_length(const config::Config& cfg, int doc_len) {
    if (doc_len == -1) return 0;
    if (doc_len < 1)
        throw Error("--doc-len: expected a mean document length of at least 1 token, got " +
                    std::to_string(doc_len));
    if (cfg.data.documents != config::DocumentMode::mask)
        throw Error(
            "--doc-len: the attention keeps within documents only under data.documents: "
            "mask (--set data.documents=mask)");
    return doc_len;
}

int plan(const PlanOptions& opts) {
    if (opts.search) return plan_search(opts);
    for (const auto& [given, option] :
         {std::pair{opts.gpus != 0, "--gpus"}, std::pair{!opts.fixes.empty(), "--fix"},
          std::pair{opts.top != -1, "--top"},
          std::pair{opts.allow_cross_node_tp, "--allow-cross-node-tp"}})
        if (given) throw Error(std::string(option) + " is an option of --search");
    const config::Config cfg = config::load(opts.config, opts.overrides, config::Purpose::plan);
    print_warnings(cfg);
    plan::PlanInputs inputs = plan::plan_inputs(
        cfg, plan::gradient_bytes(cfg.training.precision, cfg.training.fp32_grad_accumulation));
    if (opts.zero_stage != -1) {
        if (opts.zero_stage < 0 || opts.zero_stage > 3)
            throw Error("--zero-stage: expected 0, 1, 2 or 3, got " +
                        std::to_string(opts.zero_stage));
        inputs.zero_stage = opts.zero_stage;
    }
    inputs.doc_len = document_length(cfg, opts.doc_len);
    std::optional<double> device_memory;
    if (!opts.device_memory.empty()) device_memory = parse_size(opts.device_memory);
    warn_lora(cfg);
    const plan::Plan p = plan::make_plan(inputs, plan_hardware(opts), device_memory);
    const std::string text = opts.json ? plan::render_json(p) : plan::render_text(p);
    std::fputs(text.c_str(), stdout);
    return 0;
}

}  // namespace trident::commands
