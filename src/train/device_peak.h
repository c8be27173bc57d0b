// The peak FLOP rate that MFU is measured against.
//
// For the CPU there is no datasheet figure worth trusting (clocks, SIMD width and cores
// vary), so the peak is the fp32 GEMM rate this machine actually reaches, measured at
// start-up with the backend's own matmul on square 2048 matrices.
#pragma once

#include "kernels/ops.h"

namespace trident::train {

// FLOP/s of the backend's matmul at its best of a few repetitions. Its matrices are released
// and the allocator's peak restarted before it returns, so the peak memory a run reports is
// the run's own, not this probe's.
double measure_gemm_flops(kernels::Ops& ops);

}  // namespace trident::train
