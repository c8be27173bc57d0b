// AttentionOps: the model's causal attention on the GPU (Ops::attention_forward,
// attention_backward, attention_rebuild): per shape, cuDNN's fused kernels or the built-in
// flash kernels (attention.h), one choice per shape kept for the run, so that selective
// recompute's rebuild runs the forward's kernels.
//
// The choice: cuDNN without attention dropout (its mask is not the model's) where this cuDNN
// and shape are safe (cudnn_attention_refusal) and its graphs build and run; else the flash
// kernels where the head size allows; else none, an error naming the cause. Start-up
// (prepare) decides every shape the run computes and runs cuDNN's graphs once on each, so that
// an engine that builds but cannot run is found there. Should a cuDNN run fail later all the
// same, its shape goes to the flash kernels for good, said in one line on stderr, and the op
// runs again on them (a backward after a cuDNN forward too: the statistics are the same).
//
// Within documents (Ops::document_attention_forward, _backward, _rebuild: `starts` given) the
// flash kernels run whatever the choice: cuDNN's graphs here have no mask for documents.
//
// Shapes and the "+=" of the gradient are kernels/ops.h's; what a forward keeps is lse
// (B,NH,T), fp32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/dtype.h"

namespace trident::kernels::cuda {

class DeviceAllocator;

class AttentionOps {
public:
    AttentionOps(DeviceAllocator& allocator, cudaStream_t stream);
    AttentionOps(const AttentionOps&) = delete;
    AttentionOps& operator=(const AttentionOps&) = delete;

    void forward(Ptr out, float* lse, ConstPtr qkv, int B, int T, int channels, int NH,
                 float drop_prob, uint64_t seed, int head_begin, int heads_total,
                 const int32_t* starts);
    void backward(Ptr dqkv, ConstPtr dout, ConstPtr qkv, ConstPtr out, const float* lse, int B,
                  int T, int channels, int NH, float drop_prob, uint64_t seed, int head_begin,
                  int heads_total, const int32_t* starts);
    void rebuild(float* lse, ConstPtr qkv, int B, int T, int channels, int NH, float drop_prob,
                 const int32_t* starts);

    // Decides the kernels of `shape` now (cuDNN's tried on it), and returns a line for the
    // log. Throws trident::Error naming the cause when no kernel can run it.
    std::string prepare(const AttentionShape& shape);

private:
    enum class Path { cudnn, flash, none };
    struct Choice {
        Path path;
        std::string why;  // why not cuDNN (empty when cuDNN runs it)
    };

    static std::string describe(const AttentionShape& shape, const Choice& choice);
    // The choice for a shape, made on its first use (said on stderr when `announce`).
    Choice& choose(const AttentionShape& shape, bool announce);
    // The kernels to run a shape on; throws when none can.
    Path path(const AttentionShape& shape);
    // cuDNN failed to run a shape (`why`): the flash kernels take it from now on, said once.
    void leave_cudnn(const AttentionShape& shape);
    // Runs cuDNN's forward and backward graphs once on the shape; false when either fails.
    bool try_cudnn(const AttentionShape& shape);
    bool cudnn_forward(Ptr out, float* lse, ConstPtr qkv, const AttentionShape& shape);
    void flash_forward(Ptr out, float* lse, ConstPtr qkv, int B, int T, int channels, int NH,
                       float drop_prob, uint64_t seed, int head_begin, int heads_total,
                       const int32_t* starts);

    DeviceAllocator& allocator_;
    cudaStream_t stream_;
    CudnnAttention cudnn_;
    // By (type, dropout or not, B, T, channels, NH).
    std::map<std::tuple<int, bool, int, int, int, int>, Choice> choices_;
};

}  // namespace trident::kernels::cuda
