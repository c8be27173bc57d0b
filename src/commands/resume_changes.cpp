// What a resume changes of the run it continues (see resume_changes.h).
#include "commands/resume_changes.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "commands/session.h"
#include "kernels/error.h"
#include "parallel/agreement.h"
#include "train/resume_checks.h"

namespace trident::commands {

namespace {

// Another optimizer.name than the checkpoint's: refused (one line), or with
// checkpoint.allow_optimizer_change and an AdamW checkpoint, said once.
std::string optimizer_refusal(const std::string& path, const config::Config& then,
                              const config::Config& now) {
    const std::string change = train::optimizer_change(then, now);
    if (change.empty()) return "";
    if (!now.checkpoint.allow_optimizer_change)
        return "checkpoint.resume: " + path + ": " + change +
               "; its optimizer state is not this one's. Resume with the checkpoint's "
               "optimizer.name, or set checkpoint.allow_optimizer_change: true to drop an "
               "AdamW checkpoint's state";
    if (then.optimizer.name != config::OptimizerName::adamw)
        return "checkpoint.resume: " + path + ": " + change +
               "; checkpoint.allow_optimizer_change drops only AdamW's state";
    warn("checkpoint.resume: " + change + ": the state " + config::to_string(now.optimizer.name) +
         " keeps under names the checkpoint lacks starts from zero "
         "(checkpoint.allow_optimizer_change: true)");
    return "";
}

}  // namespace

void check_resume_changes(const config::Config& now, const train::CheckpointShare& ck,
                          parallel::World& world, bool leader) {
    const int step = ck.manifest.step;
    std::string error;
    if (leader) {
        try {
            const config::Config then =
                config::load((std::filesystem::path(ck.path) / "config.yaml").string());
            const std::string order = train::order_changes(then, now);
            if (!order.empty() && !now.checkpoint.allow_order_change)
                error = "checkpoint.resume: " + ck.path + ": " + order +
                        "; resuming would draw other samples than the run planned. Restore "
                        "them, or set checkpoint.allow_order_change: true if the change is "
                        "intended";
            else if (!order.empty())
                warn("checkpoint.resume: " + order +
                     "; going on (checkpoint.allow_order_change: "
                     "true)");
            if (error.empty()) error = optimizer_refusal(ck.path, then, now);
            if (const std::string steps = train::schedule_change(then, now, step); !steps.empty())
                warn("checkpoint.resume: " + steps);
        } catch (const Error& e) {
            error = std::string("checkpoint.resume: ") + e.what();
        }
        const int interval = now.checkpoint.interval;
        const int first_save = interval > 0
                                   ? std::min(now.training.steps, (step / interval + 1) * interval)
                                   : now.training.steps;
        const auto doomed = now.checkpoint.dir && first_save > step
                                ? train::checkpoints_from(*now.checkpoint.dir, first_save)
                                : std::vector<std::string>{};
        if (error.empty() && !doomed.empty())
            warn("resuming " + ck.path + " at step " + std::to_string(step) + ", but the run's " +
                 "first save, at step " + std::to_string(first_save) + ", deletes " +
                 std::to_string(doomed.size()) + " later checkpoint(s) of " + *now.checkpoint.dir +
                 " (" + doomed.front() + (doomed.size() > 1 ? " to " + doomed.back() : "") +
                 "); move them away to keep them");
    }
    error = parallel::first_failure(world.comm(), error);
    if (!error.empty()) throw EveryRankError(error);
}

}  // namespace trident::commands
