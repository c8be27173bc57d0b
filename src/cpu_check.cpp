// The processor check of the `trident` binary, before anything else of it runs. Its libraries
// are compiled for one x86-64 level (CMake's TRIDENT_CPU_ARCH, x86-64-v3 by default: AVX2 and
// FMA, so that a binary built on a login node runs on the compute nodes); on an older processor
// their first such instruction would end the process with SIGILL and no word. This file alone
// is compiled for the baseline x86-64, and its check runs before every static initialiser
// (constructor priority 101 comes before the default).
#include <cstdio>
#include <cstdlib>

#if defined(TRIDENT_CPU_LEVEL) && defined(__x86_64__)
__attribute__((constructor(101))) static void trident_check_cpu_level() {
    __builtin_cpu_init();
    if (__builtin_cpu_supports(TRIDENT_CPU_LEVEL)) return;
    std::fprintf(stderr,
                 "trident: error: this binary is built for %s processors, which this one is "
                 "not: build with cmake -DTRIDENT_CPU_ARCH=x86-64 (any x86-64), or "
                 "-DTRIDENT_NATIVE=ON on the machine that runs it\n",
                 TRIDENT_CPU_LEVEL);
    std::_Exit(1);
}
#endif
