// How many threads a pool of Trident's may start (training.threads, generate's and tokenize's
// --threads): the count asked for, 0 for every core this process may run on, and never more
// than kThreadsPerCore threads per such core. Tens of thousands of threads crash the OpenMP
// runtime (a SIGSEGV in libgomp) or starve every thread of time; past a few per core none
// makes a pool faster.
#pragma once

#include <string>

namespace trident::kernels {

inline constexpr int kThreadsPerCore = 4;

// The cores in this process's CPU affinity (what taskset, cgroups' cpusets or a batch
// system's binding leave it), at least 1.
int usable_cores();

struct ThreadCount {
    int count = 1;     // the threads to start
    std::string note;  // when `requested` was cut: what to tell the user, else ""
};

// `requested` threads (0: usable_cores()), bounded to kThreadsPerCore × usable_cores();
// `what` names the setting in the note ("training.threads: 100000 is more than ...").
ThreadCount thread_count(int requested, const std::string& what);

}  // namespace trident::kernels
