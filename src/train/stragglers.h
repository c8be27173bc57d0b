// Stragglers named (training.straggler_factor): every logging.interval steps each rank's wall
// time since the last report and the part of it spent blocked on its peers (per group, as the
// watchdog's markers time it: parallel/watchdog.h) are gathered to every rank, and a rank
// whose time outside communication ("work": the wall time less the time blocked) exceeds the
// median rank's by more than the factor is named with its grid coordinates and host
// (docs/ARCHITECTURE.md, "Stragglers").
//
// In a synchronous step every rank's wall time is the same: the ranks that wait for a slow
// one are blocked the longer, and the slow one, which never waits, works the longer. A rank
// slowed by its GPU, its CPU, its node's other tenants, a stop (SIGSTOP) or a slow file
// system is therefore the one whose work stands out. A rank stopped while it waits inside a
// collective cannot be told from its peers this way (all of them wait): the watchdog names a
// rank stopped for long (parallel/watchdog.h). The median is the lower middle value
// (of 2 ranks, the faster's), so that one straggler among few still stands out.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "parallel/comm.h"
#include "parallel/grid.h"

namespace trident::train {

class StragglerReport {
public:
    // Gathers every rank's host name (collective over `world`, the whole grid).
    StragglerReport(double factor, const parallel::GridShape& shape, parallel::Comm& world);

    // The first interval begins after step `step`: the run's first step, whose one-time
    // costs differ from rank to rank, is left out.
    void begin_after(int step);

    // The interval ending after step `step` (1-based) on every rank: the lines naming its
    // stragglers, the same on every rank (none: empty). Collective over the world.
    std::vector<std::string> report(int step);

private:
    double factor_;
    parallel::GridShape shape_;
    parallel::Comm& world_;
    std::vector<std::string> hosts_;  // by world rank
    std::chrono::steady_clock::time_point since_;
    double blocked_before_ = 0;  // seconds blocked up to the interval's start
    std::vector<double> groups_before_;
    int first_step_ = 1;  // of the interval
};

}  // namespace trident::train
