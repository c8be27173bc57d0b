// Stragglers named (see stragglers.h).
#include "train/stragglers.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "parallel/watchdog.h"

namespace trident::train {

namespace {

// The groups a rank can wait in, in the order each rank sends its times.
constexpr const char* kGroups[] = {"tensor",       "context",   "data",       "data-context",
                                   "pipeline",     "embedding", "kv-replica", "data-shard",
                                   "data-replica", "world",     "device"};
constexpr std::size_t kNumGroups = std::size(kGroups);

// This rank's seconds blocked so far in each of kGroups.
std::vector<double> blocked_by_group() {
    const std::map<std::string, double> now = parallel::blocked_seconds();
    std::vector<double> out(kNumGroups, 0.0);
    for (std::size_t g = 0; g < kNumGroups; ++g)
        if (const auto it = now.find(kGroups[g]); it != now.end()) out[g] = it->second;
    return out;
}

std::string seconds(double s) {
    char text[32];
    std::snprintf(text, sizeof text, "%.3f s", s);
    return text;
}

}  // namespace

StragglerReport::StragglerReport(double factor, const parallel::GridShape& shape,
                                 parallel::Comm& world)
    : factor_(factor), shape_(shape), world_(world) {
    parallel::account_blocked_time();
    char host[64] = {};
    if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
    std::vector<char> all(sizeof host * static_cast<std::size_t>(world.size()));
    world.all_gather(kernels::ConstPtr(host, kernels::DType::u8),
                     kernels::Ptr(all.data(), kernels::DType::u8), sizeof host);
    for (int r = 0; r < world.size(); ++r)
        hosts_.emplace_back(all.data() + sizeof host * static_cast<std::size_t>(r));
}

void StragglerReport::begin_after(int step) {
    groups_before_ = blocked_by_group();
    since_ = std::chrono::steady_clock::now();
    first_step_ = step + 1;
}

std::vector<std::string> StragglerReport::report(int step) {
    // This rank's wall time, then its time blocked in each group, over the interval.
    const std::vector<double> groups = blocked_by_group();
    std::vector<double> mine(1 + kNumGroups);
    mine[0] = std::chrono::duration<double>(std::chrono::steady_clock::now() - since_).count();
    for (std::size_t g = 0; g < kNumGroups; ++g) mine[1 + g] = groups[g] - groups_before_[g];
    const std::size_t n = mine.size(), ranks = static_cast<std::size_t>(world_.size());
    std::vector<double> all(n * ranks);
    world_.all_gather(kernels::ConstPtr(mine.data(), kernels::DType::f64),
                      kernels::Ptr(all.data(), kernels::DType::f64), n);
    const int first = first_step_, steps = step - first_step_ + 1;
    begin_after(step);  // the gather's own wait belongs to the next interval

    std::vector<double> work(ranks);
    for (std::size_t r = 0; r < ranks; ++r) {
        double blocked = 0;
        for (std::size_t g = 0; g < kNumGroups; ++g) blocked += all[r * n + 1 + g];
        work[r] = std::max(0.0, all[r * n] - blocked) / steps;
    }
    std::vector<double> sorted = work;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[(ranks - 1) / 2];
    std::vector<std::string> lines;
    for (std::size_t r = 0; r < ranks; ++r) {
        if (work[r] <= factor_ * median) continue;
        std::string waits;
        for (std::size_t g = 0; g < kNumGroups; ++g)
            if (all[r * n + 1 + g] > 0)
                waits += std::string(waits.empty() ? "" : ", ") + kGroups[g] + " " +
                         seconds(all[r * n + 1 + g] / steps);
        char ratio[96];
        std::snprintf(ratio, sizeof ratio,
                      "%.1f times the median rank's %.3f s "
                      "(training.straggler_factor: %g)",
                      median > 0 ? work[r] / median : 0.0, median, factor_);
        lines.push_back("straggler: steps " + std::to_string(first) + "-" + std::to_string(step) +
                        ": rank " + parallel::describe_rank(shape_, static_cast<int>(r)) +
                        " on host " + hosts_[r] + " works " + seconds(work[r]) +
                        " a step outside communication, " + ratio + "; it waits " +
                        (waits.empty() ? "in no group" : waits) + " a step");
    }
    return lines;
}

}  // namespace trident::train
