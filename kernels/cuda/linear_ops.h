// LinearOps: the linear layer on the GPU (kernels/ops.h, "linear"), for CudaOps to call. The
// products are cuBLASLt's (gemm.h), the bias in their epilogue; the bias gradient and a
// row-parallel linear's bias are kernels of bias_grad.cu and pointwise.cu. Like CudaOps' other
// ops, each runs directly when cuBLASLt multiplies its arguments' types, and through fp32 views
// (fp32_views.h) for any other mix.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/fp32_views.h"
#include "kernels/cuda/gemm.h"
#include "kernels/dtype.h"

namespace trident::kernels::cuda {

class DeviceAllocator;

class LinearOps {
public:
    // tf32: fp32 products in TF32 on the tensor cores (gemm.h).
    LinearOps(DeviceAllocator& allocator, cudaStream_t stream, bool tf32)
        : allocator_(allocator), stream_(stream), gemm_(allocator, tf32) {}
    LinearOps(const LinearOps&) = delete;
    LinearOps& operator=(const LinearOps&) = delete;

    void matmul_forward(Ptr out, ConstPtr inp, ConstPtr weight, ConstPtr bias, int N, int channels,
                        int OC);
    void matmul_backward(Ptr dinp, Ptr dweight, Ptr dbias, ConstPtr dout, ConstPtr inp,
                         ConstPtr weight, int N, int channels, int OC);
    void add_bias(Ptr out, ConstPtr bias, int N, int OC);

private:
    // out (rows, cols) = a' @ b' + beta * out (+ bias): a' is a or a^T (trans_a), b' likewise.
    void product(Ptr out, ConstPtr a, bool trans_a, ConstPtr b, bool trans_b, int rows, int cols,
                 int inner, float beta, ConstPtr bias);
    Fp32Views views() { return Fp32Views(DeviceScratch(allocator_, stream_)); }

    DeviceAllocator& allocator_;
    cudaStream_t stream_;
    Gemm gemm_;
};

}  // namespace trident::kernels::cuda
