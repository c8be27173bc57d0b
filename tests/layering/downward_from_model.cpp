// Must compile: the model includes the layers below it (docs/ARCHITECTURE.md, "Layers"); the
// layering test's control, so that a probe failing for another reason is told apart.
#include "kernels/ops.h"
#include "model/gpt.h"
#include "parallel/comm.h"
