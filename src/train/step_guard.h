// Which steps' updates a run applies (docs/ARCHITECTURE.md, "Bad steps"). A step's loss and
// gradient norm are reduced over the whole grid before the update, so they are the same on
// every rank, and so is every verdict taken from them: ranks skip the same updates, or stop
// together, without a word exchanged for it.
//
// - A non-finite loss or gradient norm (bf16, fp32): with training.nonfinite: skip the update
//   is skipped, with stop the run ends; either way the message names where the value was
//   first seen (Trainer says which rank saw it, a collective only such a step pays for). A
//   negative loss, which no cross-entropy can be, is taken alike (skip reason
//   impossible_loss).
//   fp16's non-finite steps are the loss scaler's overflows (optim/loss_scaler.h), unchanged.
// - A spike (training.skip_spikes, llm.c's rule): once `window` updates have been applied, a
//   step whose loss or gradient norm lies more than `zscore` standard deviations above the
//   mean of the last `window` applied steps' is skipped. Skipped steps do not enter the
//   window, so a run of spikes does not widen it.
// - training.max_skipped updates skipped in a row (non-finite or spikes) stop the run.
//
// The window and the count of skips in a row are part of a checkpoint (State), so a resumed
// run takes the verdicts the uninterrupted one would.
#pragma once

#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "config/config.h"
#include "kernels/error.h"

namespace trident::train {

// Thrown alike on every rank when training must stop for its own health (a non-finite step
// under training.nonfinite: stop, too many updates skipped in a row).
class TrainingStopped : public Error {
public:
    using Error::Error;
};

// What a step's figures say about its update.
struct Verdict {
    bool apply = true;
    // when skipped: nonfinite, impossible_loss, overflow (fp16), loss_spike, grad_norm_spike
    std::string reason;
    std::string note;  // when skipped (but for fp16's overflows): why, as the log says it
};

class StepGuard {
public:
    explicit StepGuard(const config::TrainingConfig& t);

    // The verdict on step `step` (1-based) of `loss` and (unscaled) `grad_norm`, each the same
    // on every rank. `first_sighting` says where a non-finite value was first seen; it is
    // called (collectively) only when one is. Throws TrainingStopped, with the message, where
    // training is to stop.
    Verdict judge(int step, double loss, double grad_norm,
                  const std::function<std::string()>& first_sighting);

    // What a checkpoint keeps.
    struct State {
        int skipped_in_a_row = 0;
        std::vector<double> losses, grad_norms;  // the last applied steps', oldest first
    };
    State state() const;
    void restore(const State& state);

private:
    // A step no update may follow (non-finite, or an impossible loss): stopped or skipped as
    // training.nonfinite says.
    Verdict bad_step(int step, const char* reason, const std::string& what);
    Verdict skip(int step, const char* reason, const std::string& what);
    // The spike `figure` (a loss or a gradient norm) makes, against `recent`; "" if none.
    std::string spike(const char* name, double figure, const std::deque<double>& recent) const;

    config::NonFinite nonfinite_;
    config::SkipSpikes spikes_;
    int max_skipped_;
    int skipped_in_a_row_ = 0;
    std::deque<double> losses_, grad_norms_;
};

}  // namespace trident::train
