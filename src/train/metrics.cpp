// Metrics to stdout, JSON lines and TensorBoard (see metrics.h).
#include "train/metrics.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "io/json_line.h"
#include "kernels/error.h"

namespace trident::train {

MetricsLog::MetricsLog(const std::optional<std::string>& path, int interval, bool append,
                       const std::optional<std::string>& tensorboard)
    : interval_(interval) {
    try {
        if (tensorboard) events_ = std::make_unique<io::EventWriter>(*tensorboard);
    } catch (const std::exception& e) {
        throw Error(std::string("logging.tensorboard: ") + e.what());
    }
    if (!path) return;
    const std::filesystem::path p(*path);
    try {
        if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
        file_ = std::make_unique<io::OutputFile>(
            *path, append ? io::OutputFile::Mode::append : io::OutputFile::Mode::create);
    } catch (const std::exception& e) {
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

void MetricsLog::print(const StepMetrics& m) const {
    if (m.step % interval_ != 0 && m.step != m.steps && !m.val_loss) return;
    std::printf(
        "step %5d/%d | loss %.4f | lr %.2e | norm %.4f | %.0f tok/s | %.3f TFLOP/s | "
        "MFU %.1f%% | %.0f ms | ETA %s",
        m.step, m.steps, m.loss, m.lr, m.grad_norm, m.tokens_per_s, m.tflops, 100.0 * m.mfu,
        m.step_ms, human_duration(m.eta_s).c_str());
    if (m.loss_scale != 1) std::printf(" | scale %g", m.loss_scale);
    if (m.skipped_total > 0)
        std::printf(" | %s (%d so far)",
                    m.skipped ? ("skipped: " + m.skip_reason).c_str() : "applied", m.skipped_total);
    if (m.val_loss) std::printf(" | val_loss %.4f", *m.val_loss);
    std::printf("\n");
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
    line.add("activation_sets", m.activation_sets);
    using parallel::CommKind;
    for (const auto& [group, stats] :
         {std::pair{"tp", &m.tensor_comm}, std::pair{"dp", &m.data_comm}})
        for (const auto& [name, kind] : {std::pair{"all_reduce", CommKind::all_reduce},
                                         std::pair{"all_gather", CommKind::all_gather},
                                         std::pair{"reduce_scatter", CommKind::reduce_scatter}})
            line.add(std::string(group) + "_" + name + "_bytes",
                     static_cast<int64_t>(stats->bytes_of(kind)));
    // The context group: ring attention's keys, values and their gradients, Ulysses'
    // all-to-alls.
    for (const auto& [name, kind] :
         {std::pair{"send", CommKind::send}, std::pair{"all_to_all", CommKind::all_to_all}})
        line.add(std::string("cp_") + name + "_bytes",
                 static_cast<int64_t>(m.context_comm.bytes_of(kind)));
    line.add("mem_params_bytes", m.mem_params)
        .add("mem_grads_bytes", m.mem_grads)
        .add("mem_optimizer_bytes", m.mem_optimizer)
        .add("mem_activations_bytes", m.mem_activations)
        .add("mem_peak_bytes", m.mem_peak);
    file_->write_record(line.str() + "\n");
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
    char buf[32];
    if (bytes >= 1e9)
        std::snprintf(buf, sizeof buf, "%.2f GB", bytes / 1e9);
    else if (bytes >= 1e6)
        std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
    else
        std::snprintf(buf, sizeof buf, "%.1f KB", bytes / 1e3);
    return buf;
}

}  // namespace trident::train
