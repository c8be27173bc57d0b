// Fp32Staging: how the GPU backend runs an op whose arguments mix element types in a way its
// kernels do not take directly (fp32 inputs into a bf16 output, say).
//
// For the length of one op each argument is seen as an fp32 device array: fp32 buffers as
// they are, 16-bit ones widened into scratch (exactly); commit() rounds the scratch of every
// output back into its buffer, once. That is what a kernel reading 16-bit values, computing in
// fp32 and storing 16-bit values does, so the fp32 kernels serve every mix, at the cost of
// the extra passes. Arguments that alias (dropout in place, dlogits over logits) share one
// scratch array. The common cases (one type throughout; parameter gradients in fp32) never
// come here.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "kernels/dtype.h"

namespace trident::kernels::cuda {

class DeviceAllocator;

class Fp32Staging {
public:
    Fp32Staging(DeviceAllocator& allocator, cudaStream_t stream)
        : allocator_(allocator), stream_(stream) {}
    ~Fp32Staging();  // releases the scratch (queued work may still use it: it is stream-ordered)
    Fp32Staging(const Fp32Staging&) = delete;
    Fp32Staging& operator=(const Fp32Staging&) = delete;

    // An input of `count` elements (null stays null).
    const float* in(ConstPtr p, std::size_t count);
    // An output the op overwrites entirely.
    float* out(Ptr p, std::size_t count);
    // An output the op reads and adds into (+=).
    float* inout(Ptr p, std::size_t count);
    // Rounds every output's scratch into its buffer; call once the op is queued.
    void commit();

private:
    struct View {
        const void* data;
        DType dtype;
        std::size_t count;
        float* scratch;
        bool widened, written;
    };
    float* view(const void* data, DType dtype, std::size_t count, bool read, bool write);

    DeviceAllocator& allocator_;
    cudaStream_t stream_;
    std::vector<View> views_;
};

}  // namespace trident::kernels::cuda
