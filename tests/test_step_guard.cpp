// The step guard's verdicts (train/step_guard.h): spikes by z-score over the last applied
// steps, updates skipped in a row, and its state carried through a checkpoint.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "config/config.h"
#include "train/step_guard.h"

using namespace trident;

namespace {

config::TrainingConfig guard_config(double zscore, int window, int max_skipped) {
    config::TrainingConfig t;
    t.skip_spikes = {zscore, window};
    t.max_skipped = max_skipped;
    t.nonfinite = config::NonFinite::skip;
    return t;
}

const auto kNobody = [] { return std::string("seen nowhere"); };

}  // namespace

TEST_CASE("step guard: a spike against the mean and deviation of the last applied steps",
          "[training]") {
    train::StepGuard guard(guard_config(3.0, 4, 0));
    // The window fills first: no verdict before it holds 4 steps.
    const double losses[] = {1.0, 1.1, 0.9, 1.0}, norms[] = {1.0, 1.2, 0.8, 1.0};
    for (int i = 0; i < 4; ++i) CHECK(guard.judge(i + 1, losses[i], norms[i], kNobody).apply);
    // Mean 1.0, population deviation sqrt(0.02 / 4) = 0.0707: 1.2 is 2.83 deviations above
    // (applied), 1.22 is 3.11 (skipped).
    const train::Verdict high = guard.judge(5, 1.22, 1.0, kNobody);
    CHECK_FALSE(high.apply);
    CHECK(high.reason == "loss_spike");
    CHECK(high.note ==
          "step 5: the loss 1.22 is 3.1 standard deviations above the mean of the last 4 "
          "applied steps (1, deviation 0.0707; training.skip_spikes.zscore: 3); the update is "
          "skipped on every rank (1 in a row; training.max_skipped: 0)");
    // The skipped step did not enter the window: the same figures are judged alike.
    CHECK(guard.judge(6, 1.2, 1.0, kNobody).apply);
    // Window now 1.1, 0.9, 1.0, 1.2 (mean 1.05, deviation 0.112); norms 1.2, 0.8, 1.0, 1.0
    // (mean 1.0, deviation 0.141): a norm of 1.5 is 3.54 deviations above.
    const train::Verdict norm = guard.judge(7, 1.05, 1.5, kNobody);
    CHECK(norm.reason == "grad_norm_spike");
    CHECK(norm.note.find("the gradient norm 1.5 is 3.5 standard deviations") != std::string::npos);
    // A loss far below the mean is no spike.
    CHECK(guard.judge(8, 0.1, 1.0, kNobody).apply);
}

TEST_CASE("step guard: non-finite steps skipped or stopped, and too many skips in a row stop",
          "[training]") {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    train::StepGuard guard(guard_config(0.0, 100, 3));
    int asked = 0;
    const auto sighting = [&] {
        ++asked;
        return std::string("non-finite gradients on rank 1");
    };
    CHECK(guard.judge(1, 2.0, 1.0, sighting).apply);
    CHECK(asked == 0);  // a finite step asks nobody
    const train::Verdict v = guard.judge(2, nan, 1.0, sighting);
    CHECK(asked == 1);
    CHECK(v.reason == "nonfinite");
    CHECK(v.note ==
          "step 2: the loss or gradients are not finite (non-finite gradients on rank 1); the "
          "update is skipped on every rank (1 in a row; training.max_skipped: 3)");
    CHECK_FALSE(guard.judge(3, 2.0, INFINITY, sighting).apply);
    CHECK(guard.judge(4, 2.0, 1.0, sighting).apply);  // the count in a row starts again
    CHECK_FALSE(guard.judge(5, nan, nan, sighting).apply);
    CHECK_FALSE(guard.judge(6, nan, nan, sighting).apply);
    CHECK_THROWS_WITH(guard.judge(7, nan, nan, sighting),
                      "step 7: 3 updates skipped in a row (training.max_skipped: 3), the last as "
                      "the loss or gradients are not finite (non-finite gradients on rank 1); "
                      "training stopped");

    config::TrainingConfig stop = guard_config(0.0, 100, 3);
    stop.nonfinite = config::NonFinite::stop;
    train::StepGuard stopping(stop);
    CHECK_THROWS_AS(stopping.judge(1, nan, 1.0, sighting), train::TrainingStopped);
}

TEST_CASE("step guard: its state through a checkpoint gives the same verdicts", "[training]") {
    const config::TrainingConfig t = guard_config(2.0, 3, 5);
    train::StepGuard whole(t), first(t);
    const double losses[] = {3.0, 2.9, 3.1, 9.0, 2.95, 3.0, 7.0, 3.02};
    std::vector<bool> uninterrupted, resumed;
    for (int i = 0; i < 8; ++i)
        uninterrupted.push_back(whole.judge(i + 1, losses[i], 1.0 + 0.01 * (i % 2), kNobody).apply);
    for (int i = 0; i < 4; ++i)
        resumed.push_back(first.judge(i + 1, losses[i], 1.0 + 0.01 * (i % 2), kNobody).apply);
    const train::StepGuard::State state = first.state();
    CHECK(state.skipped_in_a_row == 1);
    CHECK(state.losses == std::vector<double>{3.0, 2.9, 3.1});
    train::StepGuard second(t);
    second.restore(state);
    for (int i = 4; i < 8; ++i)
        resumed.push_back(second.judge(i + 1, losses[i], 1.0 + 0.01 * (i % 2), kNobody).apply);
    CHECK(resumed == uninterrupted);
    CHECK(uninterrupted == std::vector<bool>{true, true, true, false, true, true, false, true});
}
