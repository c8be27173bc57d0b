// The verdicts on steps' updates (see step_guard.h).
#include "train/step_guard.h"

#include <cmath>
#include <cstdio>

namespace trident::train {

StepGuard::StepGuard(const config::TrainingConfig& t)
    : nonfinite_(t.nonfinite), spikes_(t.skip_spikes), max_skipped_(t.max_skipped) {}

Verdict StepGuard::judge(int step, double loss, double grad_norm,
                         const std::function<std::string()>& first_sighting) {
    if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
        const std::string seen = first_sighting();
        return bad_step(
            step, "nonfinite",
            "the loss or gradients are not finite" + (seen.empty() ? "" : " (" + seen + ")"));
    }
    // A cross-entropy is never negative: one that is was computed from ids or weights out of
    // bounds (a dataset rewritten under the run), not learnt.
    if (loss < 0) {
        char what[160];
        std::snprintf(what, sizeof what,
                      "the loss %.6g is negative, which a cross-entropy cannot be (token ids or "
                      "weights out of bounds)",
                      loss);
        return bad_step(step, "impossible_loss", what);
    }
    if (spikes_.enabled() && static_cast<int>(losses_.size()) == spikes_.window) {
        if (std::string s = spike("loss", loss, losses_); !s.empty())
            return skip(step, "loss_spike", s);
        if (std::string s = spike("gradient norm", grad_norm, grad_norms_); !s.empty())
            return skip(step, "grad_norm_spike", s);
    }
    skipped_in_a_row_ = 0;
    if (spikes_.enabled()) {
        losses_.push_back(loss);
        grad_norms_.push_back(grad_norm);
        if (static_cast<int>(losses_.size()) > spikes_.window) {
            losses_.pop_front();
            grad_norms_.pop_front();
        }
    }
    return {};
}

Verdict StepGuard::bad_step(int step, const char* reason, const std::string& what) {
    if (nonfinite_ == config::NonFinite::stop)
        throw TrainingStopped("step " + std::to_string(step) + ": " + what +
                              "; training stopped (training.nonfinite: skip would skip such "
                              "steps; a lower training.lr or training.grad_clip may help)");
    return skip(step, reason, what);
}

std::string StepGuard::spike(const char* name, double figure,
                             const std::deque<double>& recent) const {
    double sum = 0, squares = 0;
    for (const double x : recent) sum += x;
    const double n = static_cast<double>(recent.size()), mean = sum / n;
    for (const double x : recent) squares += (x - mean) * (x - mean);
    const double deviation = std::sqrt(squares / n);
    // Steps all alike give no scale to measure a spike against.
    if (deviation == 0 || (figure - mean) / deviation <= spikes_.zscore) return "";
    char text[256];
    std::snprintf(text, sizeof text,
                  "the %s %.6g is %.1f standard deviations above the mean of the last %d applied "
                  "steps (%.6g, deviation %.3g; training.skip_spikes.zscore: %g)",
                  name, figure, (figure - mean) / deviation, spikes_.window, mean, deviation,
                  spikes_.zscore);
    return text;
}

Verdict StepGuard::skip(int step, const char* reason, const std::string& what) {
    ++skipped_in_a_row_;
    const std::string at = "step " + std::to_string(step) + ": ";
    if (max_skipped_ > 0 && skipped_in_a_row_ >= max_skipped_)
        throw TrainingStopped(
            at + std::to_string(skipped_in_a_row_) +
            " updates skipped in a row (training.max_skipped: " + std::to_string(max_skipped_) +
            "), the last as " + what + "; training stopped");
    return Verdict{false, reason,
                   at + what + "; the update is skipped on every rank (" +
                       std::to_string(skipped_in_a_row_) +
                       " in a row; training.max_skipped: " + std::to_string(max_skipped_) + ")"};
}

StepGuard::State StepGuard::state() const {
    return State{skipped_in_a_row_,
                 {losses_.begin(), losses_.end()},
                 {grad_norms_.begin(), grad_norms_.end()}};
}

void StepGuard::restore(const State& s) {
    skipped_in_a_row_ = s.skipped_in_a_row;
    losses_.clear();
    grad_norms_.clear();
    if (!spikes_.enabled() || s.losses.size() != s.grad_norms.size()) return;
    // A window of another length (the setting changed) keeps its newest values.
    losses_.assign(s.losses.begin(), s.losses.end());
    grad_norms_.assign(s.grad_norms.begin(), s.grad_norms.end());
    while (static_cast<int>(losses_.size()) > spikes_.window) {
        losses_.pop_front();
        grad_norms_.pop_front();
    }
}

}  // namespace trident::train
