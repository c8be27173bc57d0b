// The search's text and JSON (see search_report.h).
#include "plan/search_report.h"

#include <algorithm>
#include <cmath>

#include "io/json_line.h"
#include "train/metrics.h"

namespace trident::plan {

namespace {

// The peak MFU is against: the preset GPU's datasheet figure, else the GEMM rate given.
double peak(const Hardware& hw) {
    return hw.peak_flops > 0 ? hw.peak_flops : hw.gemm_flops;
}

// Tokens a second each GPU trains, and the model FLOP/s against the peak.
double tokens_per_gpu(const Plan& p) {
    const auto& d = p.inputs.cfg.derived;
    return static_cast<double>(d.tokens_per_step) / p.time->step / d.world_size;
}
double mfu(const Plan& p) {
    const auto& d = p.inputs.cfg.derived;
    return d.flops_per_step / p.time->step / d.world_size / peak(*p.hardware);
}

std::string schedule_text(const Layout& l) {
    std::string s = pipeline::to_string(l.schedule);
    if (l.schedule == pipeline::Kind::interleaved) s += " v" + std::to_string(l.virtual_stages);
    return s;
}

const char* yes_no(bool b) {
    return b ? "yes" : "no";
}

// A part of the step time, by its name in the explanation.
struct Term {
    const char* name;
    double StepTime::*seconds;
};
constexpr Term kTerms[] = {{"compute", &StepTime::compute},
                           {"exposed tensor-parallel communication", &StepTime::tensor_comm},
                           {"context-parallel communication", &StepTime::context_comm},
                           {"expert-parallel communication", &StepTime::expert_comm},
                           {"pipeline communication", &StepTime::pipeline_comm},
                           {"bubble", &StepTime::bubble},
                           {"exposed data-parallel communication", &StepTime::data_comm},
                           {"optimizer", &StepTime::optimizer}};

// The term that differs most in `sign`'s direction (second minus first), or null; `by` is
// set to its difference.
const Term* most(const StepTime& first, const StepTime& second, double sign, double& by) {
    const Term* found = nullptr;
    by = 0;
    for (const Term& t : kTerms) {
        const double d = sign * (second.*t.seconds - first.*t.seconds);
        if (d > by) {
            by = d;
            found = &t;
        }
    }
    return found;
}

// "bubble 0.41 s against 0.95 s": a term of the two, named as recompute where that is what
// makes their compute differ.
std::string term_text(const Term& t, const Layout& a, const Layout& b, const StepTime& ta,
                      const StepTime& tb) {
    const bool recompute = t.seconds == &StepTime::compute && a.recompute != b.recompute;
    return format("%s%s %.4g s against %.4g s", recompute ? "recompute: " : "", t.name,
                  ta.*t.seconds, tb.*t.seconds);
}

}  // namespace

std::string set_line(const config::Config& base, const Layout& layout) {
    std::string out;
    for (const std::string& o : set_overrides(base, layout))
        out += (out.empty() ? "--set " : " --set ") + o;
    return out.empty() ? "(the config's own layout)" : out;
}

std::string why_first(const SearchReport& report) {
    if (report.plans.size() < 2) return "";
    const Layout& a = report.result.best[0].layout;
    const Layout& b = report.result.best[1].layout;
    const StepTime& ta = *report.plans[0].time;
    const StepTime& tb = *report.plans[1].time;
    std::string out = tb.step > ta.step
                          ? format("1 beats 2 by %.4g s a step (%.2f%%)", tb.step - ta.step,
                                   100 * (tb.step - ta.step) / tb.step)
                          : format("1 and 2 tie at %.4g s a step", ta.step);
    double gained = 0, lost = 0;
    if (const Term* gain = most(ta, tb, 1, gained))
        out += ", most in its " + term_text(*gain, a, b, ta, tb);
    // A cost under a hundredth of the gain is not what decided it.
    const Term* cost = most(ta, tb, -1, lost);
    if (cost && lost >= gained / 100)
        out += ", for " + term_text(*cost, a, b, ta, tb) + " of its own";
    std::string keys;
    for (const std::string& d : differences(a, b)) keys += (keys.empty() ? "" : ", ") + d;
    return out + "; they differ in " + (keys.empty() ? "nothing searched" : keys);
}

std::string search_summary(const SearchReport& report) {
    const SearchOptions& o = report.options;
    const SearchResult& r = report.result;
    const Hardware& hw = o.hardware;
    std::string out =
        format("search: %s on %d GPUs (%s, %d per node, %s each; tensor groups %s)%s%s\n",
               report.base.source.c_str(), o.space.gpus, hw.name.c_str(), hw.gpus_per_node,
               train::human_bytes(o.device_memory).c_str(),
               o.space.cross_node_tensor ? "may cross nodes" : "within a node",
               o.space.fixes.empty() ? "" : ", ", o.space.fixes.text().c_str());
    out += format(
        "layouts: %lld keep every rule, %lld fit; %lld step times predicted (the others' lower "
        "bound is above the slowest listed); %.2f s\n",
        static_cast<long long>(r.considered), static_cast<long long>(r.fit),
        static_cast<long long>(r.modelled), report.seconds);
    if (o.doc_len > 0)
        out += format(
            "attention within documents of %d tokens on average (--doc-len): %.4g of a "
            "causal window's scores in every step time\n",
            o.doc_len, std::min(1.0, static_cast<double>(o.doc_len) / report.base.model.seq_len));
    return out;
}

std::string render_search_text(const SearchReport& report) {
    std::string out = search_summary(report);
    out += format("ranked by predicted step time (MFU against %.4g TFLOP/s%s):\n",
                  peak(report.options.hardware) / 1e12,
                  report.options.hardware.peak_flops > 0 ? ", the GPU's peak" : ", the GEMM rate");
    out += format("%4s %5s %3s %4s %5s %-14s %4s %4s %5s %3s %7s %-9s %11s %10s %12s %6s\n", "rank",
                  "P", "M", "C", "D", "schedule", "mb", "zero", "shard", "sp", "overlap",
                  "recompute", "memory/GPU", "step (s)", "tokens/s/GPU", "MFU");
    for (std::size_t i = 0; i < report.plans.size(); ++i) {
        const Layout& l = report.result.best[i].layout;
        const Plan& p = report.plans[i];
        out += format(
            "%4zu %5d %3d %4d %5d %-14s %4d %4d %5s %3s %7s %-9s %11s %10.4g %12.1f %5.1f%%\n",
            i + 1, l.pipeline, l.tensor, l.context, l.data, schedule_text(l).c_str(), l.micro_batch,
            l.zero_stage, l.data_shard == 0 ? "all" : std::to_string(l.data_shard).c_str(),
            yes_no(l.sequence_parallel), yes_no(l.tp_overlap), config::to_string(l.recompute),
            train::human_bytes(report.result.best[i].memory).c_str(), p.time->step,
            tokens_per_gpu(p), 100 * mfu(p));
        out += "     " + set_line(report.base, l) + "\n";
    }
    const std::string why = why_first(report);
    if (!why.empty()) out += "why: " + why + "\n";
    return out;
}

std::string render_search_json(const SearchReport& report) {
    std::string out;
    for (std::size_t i = 0; i < report.plans.size(); ++i) {
        const Ranked& r = report.result.best[i];
        const Plan& p = report.plans[i];
        io::JsonLine line;
        line.add("rank", static_cast<int64_t>(i + 1))
            .add("set", set_overrides(report.base, r.layout))
            .add("layout", layout_json(p.inputs))
            .add("memory_bytes", static_cast<int64_t>(std::llround(r.memory)))
            .add("device_memory_bytes",
                 static_cast<int64_t>(std::llround(report.options.device_memory)))
            .add("step_time", step_time_json(p))
            .add("tokens_per_s_per_gpu", tokens_per_gpu(p))
            .add("mfu", mfu(p));
        if (i == 0 && report.plans.size() > 1) line.add("why", std::string_view(why_first(report)));
        out += line.str() + "\n";
    }
    return out;
}

}  // namespace trident::plan
