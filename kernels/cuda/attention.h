// Causal self-attention on the GPU without the T x T matrix: the built-in flash-attention
// kernels (attention_flash.cu) and cuDNN's fused attention (attention_cudnn.cpp), which share
// one contract. qkv (B,T,3C) holds q, k, v side by side, each (B,T,NH,hs), hs = C/NH (this
// rank's heads under tensor parallelism); out (B,T,C); scale 1/sqrt(hs). What a forward keeps
// for backward is lse (B,NH,T), fp32: each row's log-sum-exp of its scaled scores.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace trident::kernels::cuda {

// ---- built-in flash attention (attention_flash.cu) -----------------------------------------
// Head sizes up to this; every element type, attention dropout with the model's mask.
inline constexpr int kFlashMaxHeadSize = 128;
bool flash_attention_supports(int head_size);

// out (B,T,C) = dropout(softmax(q k^T scale, causal)) v; lse (B,NH,T). out may be null: the
// statistics alone, bit for bit as a full forward writes them (selective recompute). The
// dropout mask is element (b, head_begin + h, i, j) of (B, heads_total, T, T).
template <typename E>
void flash_attention_forward(E* out, float* lse, const E* qkv, int B, int T, int C, int NH,
                             float drop_prob, uint64_t seed, int head_begin, int heads_total,
                             cudaStream_t stream);
// dqkv (B,T,3C) += the gradient, given the forward's out and lse; row_dot (B,NH,T) is scratch.
template <typename E>
void flash_attention_backward(E* dqkv, float* row_dot, const E* dout, const E* qkv, const E* out,
                              const float* lse, int B, int T, int C, int NH, float drop_prob,
                              uint64_t seed, int head_begin, int heads_total, cudaStream_t stream);

}  // namespace trident::kernels::cuda
