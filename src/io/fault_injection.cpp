// Test-only faults (see fault_injection.h): each variable parsed once, on first use.
#include "io/fault_injection.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

#include "kernels/error.h"

namespace trident::io::fault {

namespace {

[[noreturn]] void malformed(const char* variable, const char* form, const char* value) {
    throw Error(std::string(variable) + ": expected " + form + ", got '" + value + "'");
}

// An errno by its name (ENOSPC) or number (28); 0 if neither.
int parse_errno(const std::string& text) {
    char* end = nullptr;
    const long number = std::strtol(text.c_str(), &end, 10);
    if (!text.empty() && *end == '\0')
        return number > 0 && number < 4096 ? static_cast<int>(number) : 0;
    for (int e = 1; e < 200; ++e) {
        const char* name = strerrorname_np(e);
        if (name && text == name) return e;
    }
    return 0;
}

// TEXT:ERRNO[:NUMBER], as TRIDENT_TEST_WRITE_ERROR and TRIDENT_TEST_READ_ERROR take it.
struct FileErrorSpec {
    std::string text;  // empty: no fault
    int error = 0;
    long number = -1;  // writes: how many fail (-1: every one); reads: how many pass first
};

FileErrorSpec parse_file_error(const char* name, const char* form, long least) {
    FileErrorSpec f;
    const char* value = std::getenv(name);
    if (!value) return f;
    const std::string s(value);
    const std::size_t first = s.find(':');
    if (first == std::string::npos || first == 0) malformed(name, form, value);
    const std::size_t second = s.find(':', first + 1);
    f.text = s.substr(0, first);
    f.error = parse_errno(
        s.substr(first + 1, second == std::string::npos ? std::string::npos : second - first - 1));
    if (f.error == 0) malformed(name, form, value);
    if (second != std::string::npos) {
        char* end = nullptr;
        f.number = std::strtol(s.c_str() + second + 1, &end, 10);
        if (*end != '\0' || end == s.c_str() + second + 1 || f.number < least)
            malformed(name, form, value);
    }
    return f;
}

struct WriteError {
    explicit WriteError(FileErrorSpec s) : spec(std::move(s)), left(spec.number) {}
    FileErrorSpec spec;
    std::atomic<long> left;  // writes still to fail; -1: every one
};

WriteError& write_error_setting() {
    static WriteError fault(parse_file_error("TRIDENT_TEST_WRITE_ERROR",
                                             "TEXT:ERRNO[:COUNT] (e.g. pp0_tp0_dp1:ENOSPC:1)", 1));
    return fault;
}

struct ReadError {
    explicit ReadError(FileErrorSpec s) : spec(std::move(s)) {}
    FileErrorSpec spec;  // number: reads that pass before every later one fails
    std::atomic<long> seen{0};
};

ReadError& read_error_setting() {
    static ReadError fault(parse_file_error(
        "TRIDENT_TEST_READ_ERROR", "TEXT:ERRNO[:SKIP] (e.g. optimizer_state.rank1:EIO:10)", 0));
    return fault;
}

struct StepRank {
    int step = -1, rank = -1;
};

const StepRank& crash_in_save_setting() {
    static const StepRank crash = [] {
        const char* value = std::getenv("TRIDENT_TEST_CRASH_IN_SAVE");
        StepRank c;
        char end = 0;
        if (value && (std::sscanf(value, "%d:%d%c", &c.step, &c.rank, &end) != 2 || c.step < 1 ||
                      c.rank < 0))
            malformed("TRIDENT_TEST_CRASH_IN_SAVE", "STEP:RANK (e.g. 6:1)", value);
        return c;
    }();
    return crash;
}

struct StepsRank {
    int first = -1, last = -1, rank = -1;
};

const StepsRank& nan_gradient_setting() {
    static const StepsRank nan = [] {
        constexpr const char* kName = "TRIDENT_TEST_NAN_GRADIENT";
        const char* value = std::getenv(kName);
        StepsRank n;
        if (!value) return n;
        char end = 0;
        const bool range = std::sscanf(value, "%d-%d:%d%c", &n.first, &n.last, &n.rank, &end) == 3;
        if (!range && std::sscanf(value, "%d:%d%c", &n.first, &n.rank, &end) == 2) n.last = n.first;
        if (n.first < 1 || n.last < n.first || n.rank < 0)
            malformed(kName, "FIRST[-LAST]:RANK (e.g. 3-5:1)", value);
        return n;
    }();
    return nan;
}

struct Corruption {
    StepRank at;
    std::string tensor;  // empty: none
};

const Corruption& corrupt_replica_setting() {
    static const Corruption corruption = [] {
        constexpr const char* kName = "TRIDENT_TEST_CORRUPT_REPLICA";
        const char* value = std::getenv(kName);
        Corruption c;
        if (!value) return c;
        char tensor[128] = {};
        if (std::sscanf(value, "%d:%d:%127s", &c.at.step, &c.at.rank, tensor) != 3 ||
            c.at.step < 1 || c.at.rank < 0)
            malformed(kName, "STEP:RANK:TENSOR (e.g. 4:1:h.0.ln_1.weight)", value);
        c.tensor = tensor;
        return c;
    }();
    return corruption;
}

// TRIDENT_TEST_SLOW_RANK: the rank and its milliseconds of sleep per step (rank -1: none).
const StepRank& slow_rank_setting() {
    static const StepRank slow = [] {
        constexpr const char* kName = "TRIDENT_TEST_SLOW_RANK";
        const char* value = std::getenv(kName);
        StepRank s;  // .rank, and .step holding the milliseconds
        char end = 0;
        if (value && (std::sscanf(value, "%d:%d%c", &s.rank, &s.step, &end) != 2 || s.rank < 0 ||
                      s.step < 1))
            malformed(kName, "RANK:MS (e.g. 2:30)", value);
        return s;
    }();
    return slow;
}

enum class Kind { none, error, oom, kill };

struct StepFailure {
    StepRank at;
    Kind kind = Kind::none;
};

const StepFailure& step_failure_setting() {
    static const StepFailure failure = [] {
        constexpr const char* kName = "TRIDENT_TEST_FAIL_AT_STEP";
        constexpr const char* kForm = "STEP:RANK:error|oom|kill (e.g. 3:1:oom)";
        const char* value = std::getenv(kName);
        StepFailure f;
        if (!value) return f;
        char kind[16] = {};
        char end = 0;
        if (std::sscanf(value, "%d:%d:%15[a-z]%c", &f.at.step, &f.at.rank, kind, &end) != 3 ||
            f.at.step < 1 || f.at.rank < 0)
            malformed(kName, kForm, value);
        const std::string k(kind);
        f.kind = k == "error"  ? Kind::error
                 : k == "oom"  ? Kind::oom
                 : k == "kill" ? Kind::kill
                               : Kind::none;
        if (f.kind == Kind::none) malformed(kName, kForm, value);
        return f;
    }();
    return failure;
}

// Time for the launcher to forward a line before the process is gone.
void let_output_drain() {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
}

}  // namespace

int write_error(const std::string& path) {
    WriteError& w = write_error_setting();
    if (w.spec.text.empty() || path.find(w.spec.text) == std::string::npos) return 0;
    long left = w.left.load();
    while (left != -1) {
        if (left == 0) return 0;
        if (w.left.compare_exchange_weak(left, left - 1)) break;
    }
    return w.spec.error;
}

int read_error(const std::string& path) {
    ReadError& r = read_error_setting();
    if (r.spec.text.empty() || path.find(r.spec.text) == std::string::npos) return 0;
    return r.seen.fetch_add(1) < r.spec.number ? 0 : r.spec.error;
}

bool crash_in_save(int step, int rank) {
    const StepRank& c = crash_in_save_setting();
    return c.step == step && c.rank == rank;
}

void at_step(int step, int rank) {
    if (const StepRank& slow = slow_rank_setting(); slow.rank == rank)
        std::this_thread::sleep_for(std::chrono::milliseconds(slow.step));
    const StepFailure& f = step_failure_setting();
    if (f.kind == Kind::none || f.at.step != step || f.at.rank != rank) return;
    std::fprintf(stderr, "trident: TRIDENT_TEST_FAIL_AT_STEP: rank %d fails at step %d\n", rank,
                 step);
    switch (f.kind) {
        case Kind::error:
            throw Error("TRIDENT_TEST_FAIL_AT_STEP: a failure of this rank alone");
        case Kind::oom:
            throw std::bad_alloc();
        case Kind::kill:
            let_output_drain();
            std::raise(SIGKILL);
            std::abort();  // not reached: SIGKILL cannot be caught
        case Kind::none:
            break;
    }
}

bool nan_gradient(int step, int rank) {
    const StepsRank& n = nan_gradient_setting();
    return n.rank == rank && step >= n.first && step <= n.last;
}

std::string corrupt_replica(int step, int rank) {
    const Corruption& c = corrupt_replica_setting();
    return c.at.step == step && c.at.rank == rank ? c.tensor : "";
}

void check_settings() {
    corrupt_replica_setting();
    slow_rank_setting();
    nan_gradient_setting();
    write_error_setting();
    read_error_setting();
    crash_in_save_setting();
    step_failure_setting();
}

}  // namespace trident::io::fault
