// The GPU backend's entry point (the CPU's is make_cpu_ops in kernels/ops.h): CudaOps
// implements the Ops interface on device buffers of the GPU that cuda::use_gpu chose
// (kernels/cuda/device.h), with every op queued on that GPU's compute stream.
#pragma once

#include <memory>

#include "kernels/ops.h"

namespace trident::kernels {

// Call after cuda::use_gpu. Creates the cuBLASLt and cuDNN handles and the GEMM workspace.
std::unique_ptr<Ops> make_cuda_ops();

}  // namespace trident::kernels
