// LlamaOps: Llama's layer on the GPU (kernels/ops.h, "Llama's layer": RMSNorm, rotary positions
// with grouped key/value heads, SwiGLU), for CudaOps to call. Like CudaOps' other ops, each
// runs the templated kernels of cuda_kernels.h directly when its arguments share one type (the
// RMSNorm weight's gradient may be fp32 besides), and through fp32 views (fp32_views.h) for any
// other mix.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/fp32_views.h"
#include "kernels/dtype.h"

namespace trident::kernels::cuda {

class DeviceAllocator;

class LlamaOps {
public:
    LlamaOps(DeviceAllocator& allocator, cudaStream_t stream)
        : allocator_(allocator), stream_(stream) {}
    LlamaOps(const LlamaOps&) = delete;
    LlamaOps& operator=(const LlamaOps&) = delete;

    void rmsnorm_forward(Ptr out, float* rstd, ConstPtr inp, ConstPtr weight, int N, int channels,
                         float eps);
    void rmsnorm_backward(Ptr dinp, Ptr dweight, ConstPtr dout, ConstPtr inp, ConstPtr weight,
                          const float* rstd, int N, int channels);
    void rotary_qkv_forward(Ptr out, ConstPtr qkv, int B, int T, int NH, int KVH, int hs,
                            float theta, const int32_t* positions);
    void rotary_qkv_backward(Ptr dqkv, ConstPtr dout, int B, int T, int NH, int KVH, int hs,
                             float theta, const int32_t* positions);
    void swiglu_forward(Ptr out, ConstPtr inp, int N, int F);
    void swiglu_backward(Ptr dinp, ConstPtr inp, ConstPtr dout, int N, int F);

private:
    Fp32Views views() { return Fp32Views(DeviceScratch(allocator_, stream_)); }

    DeviceAllocator& allocator_;
    cudaStream_t stream_;
};

}  // namespace trident::kernels::cuda
