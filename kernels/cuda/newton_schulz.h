// NewtonSchulz: Muon's iterations (kernels/ops.h, Ops::newton_schulz) on the GPU, every product
// a cuBLASLt GEMM (gemm.h). fp32: true fp32 products (never TF32, whatever training.tf32 says),
// as the CPU's OpenBLAS computes them. bf16: X and the products kept in bf16, each GEMM
// accumulating in fp32 and rounding its output (with the added term folded in through its
// alpha and beta) once: M = X·Xᵀ, P = c·M·M + b·M, X = P·X + a·X. Its arrays are the
// caller's scratch; it allocates only its GEMM's workspace, once.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "kernels/cuda/gemm.h"
#include "kernels/dtype.h"

namespace trident::kernels::cuda {

class DeviceAllocator;

class NewtonSchulz {
public:
    NewtonSchulz(DeviceAllocator& allocator, cudaStream_t stream)
        : allocator_(allocator), stream_(stream) {}
    NewtonSchulz(const NewtonSchulz&) = delete;
    NewtonSchulz& operator=(const NewtonSchulz&) = delete;

    // x (rows, cols), rows <= cols, fp32 on the device, in place, through `scratch`
    // (kernels/ops.h, newton_schulz_scratch); precision fp32 or bf16.
    void run(float* x, float* scratch, int rows, int cols, int steps, DType precision);

private:
    DeviceAllocator& allocator_;
    cudaStream_t stream_;
    // Made at the first call, so that a run without Muon holds no second GEMM workspace.
    std::unique_ptr<Gemm> gemm_;
};

}  // namespace trident::kernels::cuda
