// Fp32Views: how the CPU backend runs its fp32 kernels on typed (fp32, bf16, fp16) buffers.
//
// For the length of one op, each argument is seen as an fp32 array: an fp32 buffer is used
// directly; a 16-bit one is widened into a scratch array (exactly), and the scratch of every
// output is rounded back into its buffer, to nearest even, when the views go out of scope.
// So a 16-bit op reads 16-bit values, computes in fp32 and stores 16-bit values, as a GPU
// kernel with fp32 accumulation does, and the fp32 kernels serve every type.
//
// Arguments that alias (dropout in place, dlogits over logits) share one scratch array,
// whatever the order in which they are asked for.
#pragma once

#include <cstddef>
#include <vector>

#include "kernels/dtype.h"

namespace trident::kernels::cpu {

class Fp32Views {
public:
    // Scratch arrays come from `pool` (kept by the backend between ops, to reuse memory).
    explicit Fp32Views(std::vector<std::vector<float>>& pool) : pool_(pool) {}
    ~Fp32Views();  // rounds the outputs back
    Fp32Views(const Fp32Views&) = delete;
    Fp32Views& operator=(const Fp32Views&) = delete;

    // An input of `count` elements (null stays null).
    const float* in(ConstPtr p, std::size_t count);
    // An output the op overwrites entirely.
    float* out(Ptr p, std::size_t count);
    // An output the op reads and adds into (+=).
    float* inout(Ptr p, std::size_t count);

private:
    struct View {
        const void* data;
        DType dtype;
        std::size_t count;
        std::size_t slot;  // in pool_
        bool widened;      // holds the buffer's values
        bool written;      // to be rounded back
    };
    float* view(const void* data, DType dtype, std::size_t count, bool read, bool write);

    std::vector<std::vector<float>>& pool_;
    std::vector<View> views_;
};

}  // namespace trident::kernels::cpu
