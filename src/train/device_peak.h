// The peak FLOP rate that MFU is measured against.
//
// For a GPU it is the datasheet's dense bf16 rate, as the papers report MFU (docs/FORMULAS.md,
// "Peaks"). For the CPU there is no datasheet figure worth trusting (clocks, SIMD width and cores
// vary), so the peak is the fp32 GEMM rate this machine actually reaches, measured at start-up with
// the backend's own matmul on square matrices sized to take a few hundredths of a second, the
// best of several repeats (also the fallback for a GPU not listed). A busy machine can still
// measure less than a step later reaches: `hardware.peak_flops` then sets the figure.
#pragma once

#include <string>

#include "kernels/ops.h"

namespace trident::train {

// FLOP/s of the backend's matmul at its best of several repetitions (about 0.3 s in all, at
// least 3, at most 10) on the smallest square size from 512 to 4096 whose product takes 20 ms
// or more. Its matrices are released
// and the allocator's peak restarted before it returns, so the peak memory a run reports is
// the run's own, not this probe's.
double measure_gemm_flops(kernels::Ops& ops);

// The dense bf16 FLOP/s of a GPU by its name (as CUDA reports it), or 0 when not listed.
double datasheet_peak_flops(const std::string& gpu_name);

}  // namespace trident::train
