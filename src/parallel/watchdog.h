// The stall watchdog: a rank that waits too long in one communication call ends the whole job
// with a line saying where, instead of sitting in MPI forever (a peer stopped, hung or lost).
//
// Every place a rank can block on its peers marks itself for as long as it waits, with a
// Blocked on the stack: MpiComm's blocking calls and its requests' waits, the pipeline
// executor's wait for a send buffer, on the GPU the host's waits for the device (where NCCL's
// collectives complete). A marker is a few relaxed stores and one clock read, made only on
// the watched thread (the one that started the watchdog; the communicators' workers are never
// waited on except through a request). The watchdog's thread looks at the marker a few times
// per timeout; once the same wait has lasted longer than the timeout in force it prints one
// line, e.g.
//
//   trident: error: rank 0 (pp 0, tp 0, dp 0): stalled 5.0 s in all_reduce on the data group
//   (ranks 0 (pp 0, tp 0, dp 0), 1 (pp 0, tp 0, dp 1)) at step 4, microbatch 1, waiting on
//   rank 1 (pp 0, tp 0, dp 1); training.collective_timeout is 5 s: aborting the job
//
// and ends the job: NCCL's own abort first for each of its communicators (abort hooks, so a
// kernel waiting on a dead peer is freed), then MPI_Abort. The peer is named where one rank
// is waited on: a send or receive, or a group of two; in a larger group every member is
// listed, since from inside a collective a rank cannot tell which member is late.
//
// The timeout in force (training.collective_timeout) is longer while the rank does work that
// legitimately takes long between collectives: until its first step has completed
// (start-up, a resume's reads, the first step's one-time costs: collective_timeout_first_step)
// and in a checkpoint's save or load, where ranks wait for the slowest writer
// (collective_timeout_checkpoint). The longer of the allowance and the timeout applies.
//
// The trainer and the executor say where the rank is (phase, step, microbatch); the same
// words describe an out-of-memory failure (describe_progress).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "parallel/grid.h"

namespace trident::parallel {

// A group as messages name it: "tensor", "data", "pipeline", "embedding", "kv-replica",
// "data-shard", "data-replica" or "world",
// and its members' world ranks in group order.
struct GroupLabel {
    std::string name;
    std::vector<int> world_ranks;
};

// A label that lives as long as the process: the watchdog may read one just as the call
// that marked it ends and its communicator goes. Labels are few (a handful per grid).
const GroupLabel* make_group_label(std::string name, std::vector<int> world_ranks);

// Marks the watched thread as waiting, for this object's lifetime, in `operation` (a string
// literal) on `group`, on group rank `peer` (-1: the group as a whole). Nested markers (a
// communicator over another) show the innermost; the outer one is back when it ends. Does
// nothing on other threads, or when no watchdog runs.
class Blocked {
public:
    Blocked(const char* operation, const GroupLabel* group, int peer = -1) noexcept;
    ~Blocked();
    Blocked(const Blocked&) = delete;
    Blocked& operator=(const Blocked&) = delete;

private:
    bool marked_ = false;
    // The wait the marker replaced, restored when it ends.
    const char* operation_ = nullptr;
    const GroupLabel* group_ = nullptr;
    int peer_ = -1;
    int64_t since_ns_ = 0;
    // On a thread that accounts its waits: counted in the markers open, and (the outermost)
    // timed.
    bool counted_ = false, timed_ = false;
    const GroupLabel* waited_on_ = nullptr;
    int64_t began_ns_ = 0;
};

// The time the calling thread has spent blocked on its peers, by group name ("tensor",
// "data", ...; "device" for waits for the GPU), from the outermost marker of nested ones
// (train/stragglers.h reads it). Kept from the first call of account_blocked_time on the
// thread on, whether or not a watchdog runs: a clock read per marker.
void account_blocked_time();
std::map<std::string, double> blocked_seconds();

// On the GPU, NCCL's collectives return at once and complete on the device: a host that then
// waits for the device (a copy to the host, a synchronisation) marks kDeviceWait, and each
// NCCL collective queued is noted, so a stall there names the last one.
inline constexpr const char* kDeviceWait = "a wait for the GPU";
void note_device_collective(const char* operation, const GroupLabel* group);

// Where the rank is in its work. Set by the trainer (phase, step) and the executor
// (microbatch); read by the watchdog and by describe_progress. Outside the others, the phase
// is set_up: before the first step, or between steps.
enum class Phase { set_up, training, validation, checkpoint };

// For its lifetime the rank is in `phase` (the previous phase after). An exception that leaves
// the scope leaves behind where it was thrown, for describe_failure_site.
class ScopedPhase {
public:
    explicit ScopedPhase(Phase phase);
    ~ScopedPhase();
    ScopedPhase(const ScopedPhase&) = delete;
    ScopedPhase& operator=(const ScopedPhase&) = delete;

private:
    Phase previous_;
    int exceptions_;  // in flight when the scope began
};

void set_step(int step);              // 1-based: the step under way, or the last one done
void set_microbatch(int microbatch);  // 0-based (messages count from 1); -1: none
void first_step_done();               // the first-step allowance is over
// "at step 5, microbatch 2", "in validation after step 4", "in a checkpoint save or load
// after step 4", "after step 4", "before the first step".
std::string describe_progress();
// Where the exception being handled was thrown, as the innermost ScopedPhase it left saw it
// (describe_progress if it left none since the step began).
std::string describe_failure_site();

// Run by the watchdog before it aborts the job (NCCL's own abort of a communicator). Returns
// an id for remove_abort_hook.
int add_abort_hook(std::function<void()> hook);
void remove_abort_hook(int id);

struct WatchdogSettings {
    double timeout_s = 600;      // training.collective_timeout; 0: no watchdog
    double first_step_s = 1800;  // training.collective_timeout_first_step
    double checkpoint_s = 1800;  // training.collective_timeout_checkpoint
    GridShape grid;              // names ranks by their coordinates
    int world_rank = 0;
    // What to do with the line, instead of printing it and aborting the job (unit tests).
    std::function<void(const std::string&)> on_stall;
};

// The watchdog of this process: watches the thread that constructs it until destroyed. One
// at a time.
class Watchdog {
public:
    explicit Watchdog(WatchdogSettings settings);
    ~Watchdog();
    Watchdog(const Watchdog&) = delete;
    Watchdog& operator=(const Watchdog&) = delete;

    // The message for a wait of `seconds` in the marker now set (for tests).
    std::string describe_stall(double seconds) const;

private:
    void loop();
    double timeout_now() const;  // the timeout in force in the current phase
    [[noreturn]] void abort_job(const std::string& message) const;

    WatchdogSettings settings_;
    std::thread thread_;
    std::mutex mutex_;
    std::condition_variable wake_;
    bool stopping_ = false;
};

}  // namespace trident::parallel
