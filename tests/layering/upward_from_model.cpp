// Must not compile: the model includes nothing of the runtime's parts above it
// (docs/ARCHITECTURE.md, "Layers"). Built by the layering test (tests/CMakeLists.txt), which
// expects this include to be missing.
#include "train/trainer.h"
