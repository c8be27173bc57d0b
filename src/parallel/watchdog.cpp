// The stall watchdog (see watchdog.h).
#include "parallel/watchdog.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <map>
#include <new>
#include <string_view>

#include "kernels/error.h"
#include "kernels/host_wait.h"

namespace trident::parallel {

namespace {

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// The watched thread's wait, written by that thread alone and read by the watchdog's. A
// seqlock: `generation` is odd while the fields change, so a reader that sees the same even
// generation before and after its reads has read one consistent wait.
struct Marker {
    std::atomic<uint64_t> generation{0};
    std::atomic<const char*> operation{nullptr};
    std::atomic<const GroupLabel*> group{nullptr};
    std::atomic<int> peer{-1};
    std::atomic<int64_t> since_ns{0};  // 0: not waiting
};
Marker marker;

struct Wait {
    const char* operation = nullptr;
    const GroupLabel* group = nullptr;
    int peer = -1;
    int64_t since_ns = 0;
};

Wait current;  // what `marker` holds, as the watched thread (its only writer) last wrote it

void write_marker(const Wait& w) {
    current = w;
    const uint64_t g = marker.generation.load(std::memory_order_relaxed);
    marker.generation.store(g + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    marker.operation.store(w.operation, std::memory_order_relaxed);
    marker.group.store(w.group, std::memory_order_relaxed);
    marker.peer.store(w.peer, std::memory_order_relaxed);
    marker.since_ns.store(w.since_ns, std::memory_order_relaxed);
    marker.generation.store(g + 2, std::memory_order_release);
}

Wait read_marker() {
    for (;;) {
        const uint64_t before = marker.generation.load(std::memory_order_acquire);
        Wait w{marker.operation.load(std::memory_order_relaxed),
               marker.group.load(std::memory_order_relaxed),
               marker.peer.load(std::memory_order_relaxed),
               marker.since_ns.load(std::memory_order_relaxed)};
        std::atomic_thread_fence(std::memory_order_acquire);
        if (before % 2 == 0 && marker.generation.load(std::memory_order_relaxed) == before)
            return w;
        std::this_thread::yield();
    }
}

thread_local bool watched = false;

// Blocked time, on threads that account it: the markers open, and the seconds per group.
thread_local bool accounting = false;
thread_local int open_markers = 0;
thread_local std::vector<std::pair<const GroupLabel*, double>> blocked_by_group;

void account(const GroupLabel* group, double seconds) {
    auto it = std::find_if(blocked_by_group.begin(), blocked_by_group.end(),
                           [&](const auto& g) { return g.first == group; });
    if (it == blocked_by_group.end()) it = blocked_by_group.insert(it, {group, 0.0});
    it->second += seconds;
}

// What describe_progress said as an exception left its innermost ScopedPhase; cleared as each
// step begins. Touched by the watched thread alone.
std::string failure_site;

// The last NCCL collective queued (note_device_collective).
std::atomic<const char*> device_operation{nullptr};
std::atomic<const GroupLabel*> device_group{nullptr};

std::atomic<Phase> phase{Phase::set_up};
std::atomic<int> step{0};
std::atomic<int> microbatch{-1};
std::atomic<bool> first_done{false};

std::mutex labels_mutex;
std::deque<GroupLabel> labels;  // stable addresses: a deque never moves what it holds

std::mutex hooks_mutex;
std::map<int, std::function<void()>> hooks;
int next_hook = 0;

std::string seconds_text(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, s < 10 ? "%.1f s" : "%.0f s", s);
    return buf;
}

}  // namespace

const GroupLabel* make_group_label(std::string name, std::vector<int> world_ranks) {
    std::lock_guard lock(labels_mutex);
    labels.push_back(GroupLabel{std::move(name), std::move(world_ranks)});
    return &labels.back();
}

namespace {

// The backend's waits for the device (kernels/host_wait.h), marked as kDeviceWait.
void* begin_device_wait() {
    return new (std::nothrow) Blocked(kDeviceWait, nullptr);
}

void end_device_wait(void* begun) {
    delete static_cast<Blocked*>(begun);
}

}  // namespace

Blocked::Blocked(const char* operation, const GroupLabel* group, int peer) noexcept {
    if (!watched && !accounting) return;
    const int64_t now = now_ns();
    if (accounting) {
        counted_ = true;
        timed_ = open_markers++ == 0;
        waited_on_ = group;
        began_ns_ = now;
    }
    if (!watched) return;
    marked_ = true;
    operation_ = current.operation;
    group_ = current.group;
    peer_ = current.peer;
    since_ns_ = current.since_ns;
    write_marker(Wait{operation, group, peer, now});
}

Blocked::~Blocked() {
    if (counted_) --open_markers;
    if (timed_) account(waited_on_, static_cast<double>(now_ns() - began_ns_) / 1e9);
    if (marked_) write_marker(Wait{operation_, group_, peer_, since_ns_});
}

void account_blocked_time() {
    accounting = true;
}

std::map<std::string, double> blocked_seconds() {
    std::map<std::string, double> by_name;
    for (const auto& [group, seconds] : blocked_by_group)
        by_name[group ? group->name : "device"] += seconds;
    return by_name;
}

void note_device_collective(const char* operation, const GroupLabel* group) {
    if (!watched) return;
    device_group.store(group, std::memory_order_relaxed);
    device_operation.store(operation, std::memory_order_relaxed);
}

ScopedPhase::ScopedPhase(Phase p)
    : previous_(phase.exchange(p)), exceptions_(std::uncaught_exceptions()) {}

ScopedPhase::~ScopedPhase() {
    if (std::uncaught_exceptions() > exceptions_ && failure_site.empty())
        failure_site = describe_progress();
    phase.store(previous_);
}

void set_step(int s) {
    step.store(s);
    failure_site.clear();
}

std::string describe_failure_site() {
    return failure_site.empty() ? describe_progress() : failure_site;
}
void set_microbatch(int mb) {
    microbatch.store(mb);
}
void first_step_done() {
    first_done.store(true);
}

std::string describe_progress() {
    const int s = step.load(), mb = microbatch.load();
    const std::string after = s > 0 ? " after step " + std::to_string(s) : " before the first step";
    switch (phase.load()) {
        case Phase::set_up:
            return s > 0 ? after.substr(1) : "before the first step";
        case Phase::validation:
            return "in validation" + after;
        case Phase::checkpoint:
            return "in a checkpoint save or load" + after;
        case Phase::training:
            break;
    }
    return "at step " + std::to_string(s) +
           (mb >= 0 ? ", microbatch " + std::to_string(mb + 1) : ", after its microbatches");
}

int add_abort_hook(std::function<void()> hook) {
    std::lock_guard lock(hooks_mutex);
    hooks.emplace(next_hook, std::move(hook));
    return next_hook++;
}

void remove_abort_hook(int id) {
    std::lock_guard lock(hooks_mutex);
    hooks.erase(id);
}

Watchdog::Watchdog(WatchdogSettings settings) : settings_(std::move(settings)) {
    if (settings_.timeout_s <= 0) return;
    write_marker(Wait{});
    first_done.store(false);
    watched = true;
    kernels::watch_host_waits({begin_device_wait, end_device_wait});
    thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
    if (!thread_.joinable()) return;
    {
        std::lock_guard lock(mutex_);
        stopping_ = true;
    }
    wake_.notify_one();
    thread_.join();
    kernels::watch_host_waits({});
    watched = false;
}

double Watchdog::timeout_now() const {
    const double t = settings_.timeout_s;
    if (phase.load() == Phase::checkpoint) return std::max(t, settings_.checkpoint_s);
    if (!first_done.load()) return std::max(t, settings_.first_step_s);
    return t;
}

std::string Watchdog::describe_stall(double seconds) const {
    Wait w = read_marker();
    const GridShape& g = settings_.grid;
    const auto rank = [&](int r) { return describe_rank(g, r); };
    std::string text = "rank " + rank(settings_.world_rank) + ": stalled " + seconds_text(seconds) +
                       " in " + (w.operation ? w.operation : "a communication call");
    // A wait for the GPU is a wait for its queued NCCL collectives, the last one named.
    const char* device_op = device_operation.load(std::memory_order_relaxed);
    if (w.operation && std::string_view(w.operation) == kDeviceWait && !w.group && device_op) {
        text += std::string(" (the last NCCL collective queued: ") + device_op + ")";
        w.group = device_group.load(std::memory_order_relaxed);
    }
    int waited_on = -1;
    if (w.group) {
        const std::vector<int>& members = w.group->world_ranks;
        text += " on the " + w.group->name + " group (";
        // A long group is shortened to its first and last members.
        constexpr std::size_t kListed = 8;
        for (std::size_t i = 0; i < members.size(); ++i) {
            if (members.size() > kListed && i == kListed - 2) {
                text += ", ...";
                i = members.size() - 1;
            }
            text += (i == 0 ? "ranks " : ", ") + rank(members[i]);
        }
        text += ")";
        if (w.peer >= 0 && static_cast<std::size_t>(w.peer) < members.size()) {
            waited_on = members[static_cast<std::size_t>(w.peer)];
        } else if (members.size() == 2) {
            waited_on = members[0] == settings_.world_rank ? members[1] : members[0];
        }
    }
    text += ' ';
    text += describe_progress();
    if (waited_on >= 0) text += ", waiting on rank " + rank(waited_on);
    const bool checkpoint = phase.load() == Phase::checkpoint;
    const char* key =
        checkpoint && settings_.checkpoint_s > settings_.timeout_s
            ? "training.collective_timeout_checkpoint"
        : !checkpoint && !first_done.load() && settings_.first_step_s > settings_.timeout_s
            ? "training.collective_timeout_first_step"
            : "training.collective_timeout";
    return text + "; " + key + " is " + seconds_text(timeout_now()) + ": aborting the job";
}

void Watchdog::loop() {
    const double period_s = std::clamp(settings_.timeout_s / 10, 0.01, 1.0);
    const auto period = std::chrono::duration<double>(period_s);
    // A poll far later than asked means this process did not run meanwhile (stopped by
    // SIGSTOP, a suspended machine): a wait counts only from when it runs again. Otherwise a
    // stopped rank, let run again only to be ended, would blame the peers that waited on it.
    const auto late_ns = static_cast<int64_t>((2 * period_s + 1) * 1e9);
    int64_t last_poll = now_ns(), running_since = 0;
    std::unique_lock lock(mutex_);
    while (!wake_.wait_for(lock, period, [&] { return stopping_; })) {
        const int64_t now = now_ns();
        if (now - last_poll > late_ns) running_since = now;
        last_poll = now;
        const Wait w = read_marker();
        if (w.since_ns == 0) continue;
        const double waited = static_cast<double>(now - std::max(w.since_ns, running_since)) / 1e9;
        if (waited <= timeout_now()) continue;
        const std::string message = describe_stall(waited);
        if (settings_.on_stall) {
            settings_.on_stall(message);
            return;  // one report
        }
        abort_job(message);
    }
}

void Watchdog::abort_job(const std::string& message) const {
    std::fprintf(stderr, "trident: error: %s\n", message.c_str());
    std::fflush(stderr);
    {
        std::lock_guard lock(hooks_mutex);
        for (const auto& [id, hook] : hooks) hook();
    }
    // The launcher forwards this rank's stderr; an abort at once can cut the line off.
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);  // MPI_Abort does not return; this is for an MPI that would
}

}  // namespace trident::parallel
