// The changes a resume makes to its run (see resume_checks.h).
#include "train/resume_checks.h"

#include <filesystem>

#include "train/checkpoint_manifest.h"

namespace trident::train {

namespace {

template <typename T>
void compare(std::string& out, const char* key, const T& then, const T& now) {
    if (then == now) return;
    out += (out.empty() ? "" : "; ") + std::string(key) + ": " + std::to_string(then) +
           " in the checkpoint's run, " + std::to_string(now) + " now";
}

}  // namespace

std::string order_changes(const config::Config& then, const config::Config& now) {
    std::string changes;
    compare(changes, "training.seed", then.training.seed, now.training.seed);
    compare(changes, "training.global_batch", then.training.global_batch,
            now.training.global_batch);
    return changes;
}

std::string optimizer_change(const config::Config& then, const config::Config& now) {
    if (then.optimizer.name == now.optimizer.name) return "";
    return std::string("optimizer.name: ") + config::to_string(then.optimizer.name) +
           " in the checkpoint's run, " + config::to_string(now.optimizer.name) + " now";
}

std::string schedule_change(const config::Config& then, const config::Config& now, int step) {
    if (then.training.steps == now.training.steps) return "";
    return "training.steps is " + std::to_string(now.training.steps) +
           ", the checkpoint's run had " + std::to_string(then.training.steps) +
           ": the learning rate's decay, laid out over training.steps, is reshaped from step " +
           std::to_string(step) + " on";
}

std::vector<std::string> checkpoints_from(const std::string& dir, int step) {
    const std::string first = checkpoint_name(step);
    std::vector<std::string> doomed;
    for (const std::string& path : list_checkpoints(dir))
        if (std::filesystem::path(path).filename().string() >= first) doomed.push_back(path);
    return doomed;
}

}  // namespace trident::train
