// Must not compile: the kernels include nothing above them (docs/ARCHITECTURE.md, "Layers").
// Built by the layering test (tests/CMakeLists.txt), which expects this include to be missing.
#include "parallel/comm.h"
