// Metrics to stdout, JSON lines and TensorBoard (see metrics.h).
#include "train/metrics.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "io/json_line.h"
#include "io/json_reader.h"
#include "kernels/error.h"

namespace trident::train {

namespace {

// The bytes of the metrics file `path` to keep for a run resumed at `step`: up to the end of
// that step's line, which must be the file's last or be followed by later steps only (a run
// that went on past its last checkpoint). A half-written last line is not counted. Sets
// `note` when later steps are cut off; throws when the file does not hold this run's steps.
uint64_t bytes_to_keep(const std::string& path, int step, std::string& note) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return 0;  // missing: started afresh
    const std::string text{std::istreambuf_iterator<char>(in), {}};
    uint64_t keep = 0, offset = 0;
    int last = -1;
    bool found = false;
    for (std::size_t end; (end = text.find('\n', offset)) != std::string::npos; offset = end + 1) {
        const std::string_view line(text.data() + offset, end - offset);
        if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
        try {
            const io::json::Value row = io::json::parse(line);
            const io::json::Value* s = row.is_object() ? row.find("step") : nullptr;
            if (!s || !s->is_integer()) throw Error("no step");
            last = static_cast<int>(s->integer);
        } catch (const Error&) {
            throw Error("logging.metrics: " + path + ": line at byte " + std::to_string(offset) +
                        " is not a step record; is it a metrics file?");
        }
        if (last == step) {
            found = true;
            keep = end + 1;
        }
    }
    if (last < 0) return 0;  // nothing but perhaps half a line: started afresh
    if (!found || last < step)
        throw Error("logging.metrics: " + path + " ends at step " + std::to_string(last) +
                    " but this run resumes at step " + std::to_string(step) +
                    ": it holds another run's steps. Set logging.metrics to another file, or "
                    "move this one away");
    if (last > step)
        note = "metrics: " + path + " went on to step " + std::to_string(last) +
               "; cut back to step " + std::to_string(step) +
               ", the checkpoint's, whose later "
               "steps run again";
    return keep;
}

// Each MoE layer's load: its figures as the metrics file records them.
std::vector<io::JsonLine> moe_layers(const std::vector<MoeLayerLoad>& loads) {
    std::vector<io::JsonLine> layers;
    for (const MoeLayerLoad& load : loads) {
        io::JsonLine layer;
        layer.add("layer", load.layer)
            .add("tokens_min", load.min())
            .add("tokens_max", load.max())
            .add("tokens_cv", load.cv())
            .add("dropped", load.dropped);
        layers.push_back(std::move(layer));
    }
    return layers;
}

}  // namespace

MetricsLog::MetricsLog(const std::optional<std::string>& path, int interval,
                       std::optional<int> resumed_at, const std::optional<std::string>& tensorboard)
    : interval_(interval) {
    try {
        if (tensorboard) events_ = std::make_unique<io::EventWriter>(*tensorboard);
    } catch (const std::exception& e) {
        throw Error(std::string("logging.tensorboard: ") + e.what());
    }
    if (!path) return;
    const std::filesystem::path p(*path);
    const uint64_t keep = resumed_at ? bytes_to_keep(*path, *resumed_at, note_) : 0;
    try {
        if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
        // Opened whole, then cut to what is kept: a fresh run's replacing a file is said.
        file_ = std::make_unique<io::OutputFile>(*path, io::OutputFile::Mode::append);
        if (!resumed_at && file_->size() > 0)
            note_ = "metrics: " + *path + " held " + std::to_string(file_->size()) +
                    " bytes of an earlier run; replaced by this run's";
        if (file_->size() != keep) file_->truncate(keep);
    } catch (const std::exception& e) {
        throw Error(std::string("logging.metrics: ") + e.what());
    }
}

void MetricsLog::record_validation(int step, double val_loss) {
    if (!file_) return;
    io::JsonLine line;
    line.add("step", step).add("val_loss", val_loss);
    try {
        file_->write_record(line.str() + "\n");
    } catch (const Error& e) {
        throw Error(std::string("logging.metrics: ") + e.what());
    }
}

void MetricsLog::record(const StepMetrics& m) {
    print(m);
    // Both files are tried; the first failure is the one reported.
    std::string failure;
    try {
        if (file_) write_json(m);
    } catch (const Error& e) {
        failure = std::string("logging.metrics: ") + e.what();
    }
    try {
        if (events_) events_->scalars(m.step, tensorboard_scalars(m));
    } catch (const Error& e) {
        if (failure.empty()) failure = std::string("logging.tensorboard: ") + e.what();
    }
    if (!failure.empty()) throw Error(failure);
}

void MetricsLog::print(const StepMetrics& m) {
    if (m.step % interval_ != 0 && m.step != m.steps && !m.val_loss) return;
    std::printf(
        "step %5d/%d | loss %.4f | lr %.2e | norm %.4f | %.0f tok/s | %.3f TFLOP/s | "
        "MFU %.1f%%%s | %.0f ms | ETA %s",
        m.step, m.steps, m.loss, m.lr, m.grad_norm, m.tokens_per_s, m.tflops, 100.0 * m.mfu,
        m.mfu > 1.0 ? " (above 100%: the peak is unreliable)" : "", m.step_ms,
        human_duration(m.eta_s).c_str());
    if (m.loss_scale != 1) std::printf(" | scale %g", m.loss_scale);
    if (m.skipped_total > 0)
        std::printf(" | %s (%d so far)",
                    m.skipped ? ("skipped: " + m.skip_reason).c_str() : "applied", m.skipped_total);
    if (m.val_loss) std::printf(" | val_loss %.4f", *m.val_loss);
    std::printf("\n");
    if (m.mfu > 1.0 && !warned_mfu_) {
        warned_mfu_ = true;
        std::printf(
            "note: an MFU above 100%% means the peak measured at start-up is below what the run "
            "reaches (a busy machine); set hardware.peak_flops to this machine's peak FLOP/s per "
            "process\n");
    }
}

void MetricsLog::write_json(const StepMetrics& m) {
    io::JsonLine line;
    line.add("step", m.step)
        .add("loss", m.loss)
        .add("lr", m.lr)
        .add("grad_norm", m.grad_norm)
        .add("tokens_per_s", m.tokens_per_s)
        .add("tflops_per_gpu", m.tflops)
        .add("mfu", m.mfu)
        .add("step_ms", m.step_ms)
        .add("eta_s", m.eta_s)
        .add("loss_scale", m.loss_scale)
        .add("skipped", m.skipped)
        .add("skipped_total", m.skipped_total);
    if (m.skipped) line.add("skip_reason", m.skip_reason);
    if (m.val_loss) line.add("val_loss", *m.val_loss);
    if (m.moe_aux_loss) line.add("moe_aux_loss", *m.moe_aux_loss);
    if (m.moe_z_loss) line.add("moe_z_loss", *m.moe_z_loss);
    const std::vector<io::JsonLine> layers = moe_layers(m.moe_loads);
    if (!layers.empty()) line.add("moe_layers", std::span<const io::JsonLine>(layers));
    if (m.resumed_at) line.add("resumed_at", *m.resumed_at);
    line.add("activation_sets", m.activation_sets);
    if (m.documents_per_window > 0) line.add("documents_per_window", m.documents_per_window);
    using parallel::CommKind;
    for (const auto& [group, stats] :
         {std::pair{"tp", &m.tensor_comm}, std::pair{"dp", &m.data_comm}})
        for (const auto& [name, kind] : {std::pair{"all_reduce", CommKind::all_reduce},
                                         std::pair{"all_gather", CommKind::all_gather},
                                         std::pair{"reduce_scatter", CommKind::reduce_scatter}})
            line.add(std::string(group) + "_" + name + "_bytes",
                     static_cast<int64_t>(stats->bytes_of(kind)));
    // The data group's calls (ZeRO-3 gathers every unit once per use, or once a step).
    for (const auto& [name, kind] : {std::pair{"all_gather", CommKind::all_gather},
                                     std::pair{"reduce_scatter", CommKind::reduce_scatter}})
        line.add(std::string("dp_") + name + "_calls",
                 static_cast<int64_t>(m.data_comm.calls_of(kind)));
    // The context group: ring attention's keys, values and their gradients, Ulysses'
    // all-to-alls.
    for (const auto& [name, kind] :
         {std::pair{"send", CommKind::send}, std::pair{"all_to_all", CommKind::all_to_all}})
        line.add(std::string("cp_") + name + "_bytes",
                 static_cast<int64_t>(m.context_comm.bytes_of(kind)));
    // The replicas of a key/value head (M > KVH): its gradient's sum.
    line.add("kv_all_reduce_bytes",
             static_cast<int64_t>(m.kv_replica_comm.bytes_of(CommKind::all_reduce)));
    // The expert group (parallel.expert): the MoE layers' rows to their experts and back.
    line.add("ep_all_to_all_bytes",
             static_cast<int64_t>(m.expert_comm.bytes_of(CommKind::all_to_all)));
    // The pipeline group: activations and their gradients sent between stages; the embedding
    // group: a tied embedding's gradient summed over its first and last stage.
    line.add("pp_send_bytes", static_cast<int64_t>(m.pipeline_comm.bytes_of(CommKind::send)));
    line.add("emb_all_reduce_bytes",
             static_cast<int64_t>(m.embedding_comm.bytes_of(CommKind::all_reduce)));
    line.add("mem_params_bytes", m.mem_params)
        .add("mem_grads_bytes", m.mem_grads)
        .add("mem_optimizer_bytes", m.mem_optimizer)
        .add("mem_activations_bytes", m.mem_activations)
        .add("mem_peak_bytes", m.mem_peak);
    std::vector<io::JsonLine> stages;
    for (const auto& s : m.mem_stages) {
        io::JsonLine stage;
        stage.add("params_bytes", s[0])
            .add("grads_bytes", s[1])
            .add("optimizer_bytes", s[2])
            .add("activations_bytes", s[3])
            .add("peak_bytes", s[4]);
        stages.push_back(std::move(stage));
    }
    if (!stages.empty()) line.add("mem_stages", std::span<const io::JsonLine>(stages));
    if (m.offload_read >= 0)
        line.add("offload_read_bytes", m.offload_read)
            .add("offload_written_bytes", m.offload_written);
    if (m.offload_param_read >= 0)
        line.add("offload_param_read_bytes", m.offload_param_read)
            .add("offload_param_written_bytes", m.offload_param_written);
    file_->write_record(line.str() + "\n");
}

void StepTimes::add(double seconds) {
    recent_.push_back(seconds);
    if (recent_.size() > kWindow) recent_.pop_front();
}

double StepTimes::seconds_left(int steps_left) const {
    if (recent_.empty()) return 0;
    std::vector<double> sorted(recent_.begin(), recent_.end());
    const std::size_t n = sorted.size();
    std::nth_element(sorted.begin(), sorted.begin() + n / 2, sorted.end());
    double median = sorted[n / 2];
    if (n % 2 == 0)  // the mean of the two middle ones
        median = (median + *std::max_element(sorted.begin(), sorted.begin() + n / 2)) / 2;
    return median * steps_left;
}

std::vector<std::pair<std::string, double>> tensorboard_scalars(const StepMetrics& m) {
    // Megatron-LM's tags, where it logs the figure.
    std::vector<std::pair<std::string, double>> s = {
        {"lm loss", m.loss},
        {"learning-rate", m.lr},
        {"grad-norm", m.grad_norm},
        {"loss-scale", m.loss_scale},
        {"throughput/tokens_per_s", m.tokens_per_s},
        {"throughput/tflops_per_gpu", m.tflops},
        {"throughput/mfu", m.mfu},
        {"iteration-time", m.step_ms / 1e3},
        {"memory/peak_bytes", static_cast<double>(m.mem_peak)},
        {"memory/params_bytes", static_cast<double>(m.mem_params)},
        {"memory/grads_bytes", static_cast<double>(m.mem_grads)},
        {"memory/optimizer_bytes", static_cast<double>(m.mem_optimizer)},
        {"memory/activations_bytes", static_cast<double>(m.mem_activations)},
        {"skipped-iterations", m.skipped ? 1.0 : 0.0},
        {"skipped-iterations-total", static_cast<double>(m.skipped_total)},
    };
    if (m.val_loss) s.emplace_back("lm loss validation", *m.val_loss);
    if (m.moe_aux_loss) s.emplace_back("moe/aux_loss", *m.moe_aux_loss);
    if (m.moe_z_loss) s.emplace_back("moe/z_loss", *m.moe_z_loss);
    for (const MoeLayerLoad& load : m.moe_loads) {
        const std::string layer = "moe/layer_" + std::to_string(load.layer) + "/";
        s.emplace_back(layer + "tokens_min", load.min());
        s.emplace_back(layer + "tokens_max", load.max());
        s.emplace_back(layer + "tokens_cv", load.cv());
        s.emplace_back(layer + "dropped", static_cast<double>(load.dropped));
    }
    return s;
}

std::string human_count(double n) {
    char buf[32];
    if (n >= 1e9)
        std::snprintf(buf, sizeof buf, "%.2f B", n / 1e9);
    else if (n >= 1e6)
        std::snprintf(buf, sizeof buf, "%.2f M", n / 1e6);
    else if (n >= 1e3)
        std::snprintf(buf, sizeof buf, "%.1f K", n / 1e3);
    else
        std::snprintf(buf, sizeof buf, "%.0f", n);
    return buf;
}

std::string human_duration(double seconds) {
    const long long s = std::llround(std::max(0.0, seconds));
    char buf[32];
    if (s >= 3600)
        std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, s / 60 % 60);
    else if (s >= 60)
        std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
    else
        std::snprintf(buf, sizeof buf, "%llds", s);
    return buf;
}

std::string human_bytes(double bytes) {
    const double magnitude = std::abs(bytes);
    char buf[32];
    if (magnitude >= 0x1p30)
        std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / 0x1p30);
    else if (magnitude >= 0x1p20)
        std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / 0x1p20);
    else if (magnitude >= 0x1p10)
        std::snprintf(buf, sizeof buf, "%.1f KiB", bytes / 0x1p10);
    else
        std::snprintf(buf, sizeof buf, "%.0f B", bytes);
    return buf;
}

std::string counted(int64_t n, const std::string& noun) {
    const bool sibilant = noun.ends_with("ch") || noun.ends_with("s") || noun.ends_with("x");
    return std::to_string(n) + " " + noun + (n == 1 ? "" : sibilant ? "es" : "s");
}

}  // namespace trident::train
