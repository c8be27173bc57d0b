// Thread counts bounded by this process's cores (see threads.h).
#include "kernels/threads.h"

#include <sched.h>

#include <algorithm>

namespace trident::kernels {

int usable_cores() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(0, sizeof set, &set) != 0) return 1;
    return std::max(1, CPU_COUNT(&set));
}

ThreadCount thread_count(int requested, const std::string& what) {
    const int cores = usable_cores();
    if (requested <= 0) return {cores, ""};
    const int most = kThreadsPerCore * cores;
    if (requested <= most) return {requested, ""};
    return {most, what + ": " + std::to_string(requested) + " threads is more than " +
                      std::to_string(kThreadsPerCore) + " per core this process may use (" +
                      std::to_string(cores) + (cores == 1 ? " core" : " cores") + "): using " +
                      std::to_string(most)};
}

}  // namespace trident::kernels
