// Causal self-attention on the GPU without the T x T matrix: the built-in flash-attention
// kernels (attention_flash.cu) and cuDNN's fused attention (attention_cudnn.cpp), which share
// one contract. qkv (B,T,3·channels) holds q, k, v side by side, each (B,T,NH,hs), hs = channels/NH
// (this rank's heads under tensor parallelism); out (B,T,channels); scale 1/sqrt(hs). What a
// forward keeps for backward is lse (B,NH,T), fp32: each row's log-sum-exp of its scaled scores.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>

#include "kernels/dtype.h"

namespace trident::kernels {
struct AttentionBlock;  // kernels/ops.h
}

namespace trident::kernels::cuda {

// ---- built-in flash attention (attention_flash.cu) -----------------------------------------
// Head sizes up to this; every element type, attention dropout with the model's mask.
inline constexpr int kFlashMaxHeadSize = 128;
bool flash_attention_supports(int head_size);

// out (B,T,channels) = dropout(softmax(q k^T scale, causal)) v; lse (B,NH,T). out may be null: the
// statistics alone, bit for bit as a full forward writes them (selective recompute). The
// dropout mask is element (b, head_begin + h, i, j) of (B, heads_total, T, T). Within documents
// (kernels/ops.h, document_attention_forward), starts (B·T, on the device) gives each row's
// document's first row, and key j is then visible to query i only from there.
template <typename E>
void flash_attention_forward(E* out, float* lse, const E* qkv, int B, int T, int channels, int NH,
                             float drop_prob, uint64_t seed, int head_begin, int heads_total,
                             cudaStream_t stream, const int32_t* starts = nullptr);
// dqkv (B,T,3·channels) += the gradient, given the forward's out and lse; row_dot (B,NH,T) is
// scratch.
template <typename E>
void flash_attention_backward(E* dqkv, float* row_dot, const E* dout, const E* qkv, const E* out,
                              const float* lse, int B, int T, int channels, int NH, float drop_prob,
                              uint64_t seed, int head_begin, int heads_total, cudaStream_t stream,
                              const int32_t* starts = nullptr);

// ---- ring attention's blocks (attention_block.cu) --------------------------------------------
// kernels/ops.h, "ring attention": head sizes up to kFlashMaxHeadSize; qkv, kv, dout and out
// of one element type E; row_dot (B, NH, q_rows) is scratch.
template <typename E>
void attention_block_forward(float* out, float* lse, const E* qkv, const E* kv,
                             const AttentionBlock& block, cudaStream_t stream);
void attention_merge(float* out, float* lse, const float* block_out, const float* block_lse, int B,
                     int rows, int channels, int NH, int row_begin, int row_count,
                     cudaStream_t stream);
template <typename E>
void attention_block_backward(float* dq, float* dkv, float* row_dot, const E* dout, const E* qkv,
                              const E* kv, const E* out, const float* lse,
                              const AttentionBlock& block, cudaStream_t stream);

// ---- cuDNN fused attention (attention_cudnn.cpp) ---------------------------------------------
class DeviceAllocator;
class CudnnGraph;

// The loaded cuDNN's version as cudnnGetVersion() gives it (9.19.0: 91900), and as text with
// whether the NVRTC library its runtime-compiled engines (fused attention among them) load
// is there: "cuDNN 9.19.0 (NVRTC 13.0: /usr/local/cuda/lib64/libnvrtc.so.13)".
int cudnn_version();
std::string describe_cudnn();

// Why cuDNN's fused attention must not run causal attention over T rows with heads of
// `head_size` elements of `type` on this cuDNN (`version`) and GPU (compute capability
// `sm_major`.x), or "" when nothing known stands against it. Besides its shape limits (bf16
// or fp16; head sizes multiples of 8, up to 256 on Hopper and 128 elsewhere): cuDNN 9.10.0
// and 9.10.1 compute fused attention wrongly, and before 9.16 its backward is wrong for T not
// a multiple of 128 unless the graph carries a padding mask, which these graphs do not.
std::string cudnn_attention_refusal(int version, int sm_major, DType type, int T, int head_size);

// cuDNN 9's fused flash attention for bf16 and fp16 without dropout (cuDNN's dropout draws
// its own mask, not the model's), as operation graphs of the backend API (cudnn_graph.h): one
// forward and one backward graph per (type, B, T, channels, NH), built on first use. Its lse is the
// flash kernels' (cuDNN calls it the softmax stats), so either backward runs after either
// forward. Its backward adds dq into an fp32 buffer with atomics: results may differ in the
// last bits from run to run (the flash kernels' do not).
//
// cuDNN failing to start (no handle: a library missing, an unsupported GPU), to build a graph
// or to run one is not an error: supports() says no, with the reason, and the caller uses the
// flash kernels; forward() and backward() return false when cuDNN failed to run them, and the
// case is refused from then on.
class CudnnAttention {
public:
    struct Case;  // the graphs of one shape (attention_cudnn.cpp)

    explicit CudnnAttention(DeviceAllocator& allocator);
    ~CudnnAttention();
    CudnnAttention(const CudnnAttention&) = delete;
    CudnnAttention& operator=(const CudnnAttention&) = delete;

    // Whether cuDNN runs forward and backward for this case, building both graphs on the first
    // ask. A refusal is kept (with its reason in `why`, when given), and asked only once.
    bool supports(DType type, int B, int T, int channels, int NH, std::string* why = nullptr);
    // What runs the case: the causal mask's form (one diagonal-band operation on cuDNN 9.21 and
    // later, else four pointwise operations) and the engine of each graph with the heuristic
    // that offered it; or why cuDNN does not run it.
    std::string describe(DType type, int B, int T, int channels, int NH);

    // out (B,T,channels), lse (B,NH,T) from qkv (B,T,3·channels), out and qkv of one type; after
    // supports() said yes. False when cuDNN failed to run it (nothing written; supports() says
    // why).
    bool forward(Ptr out, float* lse, ConstPtr qkv, int B, int T, int channels, int NH,
                 cudaStream_t stream);
    // dqkv (B,T,3·channels) = the gradient (overwritten, not added) given the forward's out and
    // lse, every tensor but lse of qkv's type. False as forward().
    bool backward(Ptr dqkv, ConstPtr dout, ConstPtr qkv, ConstPtr out, const float* lse, int B,
                  int T, int channels, int NH, cudaStream_t stream);

private:
    Case& case_for(DType type, int B, int T, int channels, int NH);
    Case& supported_case(DType type, int B, int T, int channels, int NH);
    bool run(Case& c, CudnnGraph& graph, const char* which,
             const std::unordered_map<int64_t, void*>& pointers, cudaStream_t stream);

    DeviceAllocator& allocator_;
    cudnnHandle_t handle_ = nullptr;
    std::string unavailable_;  // why there is no handle
    std::map<std::tuple<int, int, int, int, int>, std::unique_ptr<Case>> cases_;
};

}  // namespace trident::kernels::cuda
