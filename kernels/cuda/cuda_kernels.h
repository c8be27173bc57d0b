// The GPU backend's kernels as host functions that queue them on a stream, one family per .cu
// file. Each is a template over the element type of its tensors, E = float, __nv_bfloat16 or
// __half, instantiated for those three in its .cu file: inputs are read widened to float, the
// arithmetic is float, outputs are rounded to E (elements.cuh). Statistics (LayerNorm
// mean/rstd, the loss's row numbers) and optimizer state are float whatever E is.
//
// Shapes and the "+=" convention are those of kernels/ops.h; CudaOps (cuda_ops.cpp) maps the
// Ops interface onto these. Nothing here adds into a buffer with atomics: every reduction has
// a fixed order, so a run repeats bit for bit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/nf4_format.h"

namespace trident::kernels::cuda {

// ---- pointwise (pointwise.cu) -----------------------------------------------------------
template <typename E>
void gelu_forward(E* out, const E* inp, std::size_t count, cudaStream_t stream);
template <typename E>  // dinp += dout * gelu'(inp)
void gelu_backward(E* dinp, const E* inp, const E* dout, std::size_t count, cudaStream_t stream);
template <typename E>
void residual_forward(E* out, const E* a, const E* b, std::size_t count, cudaStream_t stream);
template <typename E>  // out = max(inp, 0); out may be inp
void relu_forward(E* out, const E* inp, std::size_t count, cudaStream_t stream);
template <typename E>  // out = a * b * factor; out may be a or b
void multiply(E* out, const E* a, const E* b, std::size_t count, float factor, cudaStream_t stream);
template <typename E>
void scale_rows(E* out, const E* inp, const float* factors, std::size_t rows, std::size_t cols,
                cudaStream_t stream);
template <typename E>  // out may be inp
void dropout_forward(E* out, const E* inp, std::size_t count, float drop_prob, uint64_t seed,
                     uint64_t index_begin, cudaStream_t stream);
template <typename E>
void dropout_backward(E* dinp, const E* dout, std::size_t count, float drop_prob, uint64_t seed,
                      uint64_t index_begin, cudaStream_t stream);
template <typename E>  // out (N,OC) += bias (OC)
void add_bias(E* out, const E* bias, int N, int OC, cudaStream_t stream);
template <typename E>
void scale(E* x, std::size_t count, float factor, cudaStream_t stream);
template <typename TOut, typename TIn>  // out = in, rounded to TOut
void convert(TOut* out, const TIn* in, std::size_t count, cudaStream_t stream);
// out (rows, cols) with row stride out_stride = in (rows, cols) with row stride in_stride,
// rounded to TOut (kernels/ops.h, copy_2d, between two types).
template <typename TOut, typename TIn>
void convert_2d(TOut* out, std::size_t out_stride, const TIn* in, std::size_t in_stride,
                std::size_t rows, std::size_t cols, cudaStream_t stream);

// ---- a 4-bit frozen base (nf4.cu) ---------------------------------------------------------
// out (m.count) = each element's code-book value · its block's absmax, rounded to out's type
// (kernels/ops.h, nf4_dequantize).
void nf4_dequantize(Ptr out, const Nf4Matrix& m, cudaStream_t stream);

// ---- attention against a key/value cache, fp32 (cached_attention.cu) ----------------------
void cached_attention_forward(float* out, float* k_cache, float* v_cache, const float* qkv,
                              int rows, int first, int NH, int KVH, int hs, cudaStream_t stream);

// ---- layer norm, eps 1e-5 (layernorm.cu) --------------------------------------------------
template <typename E>
void layernorm_forward(E* out, float* mean, float* rstd, const E* inp, const E* weight,
                       const E* bias, int N, int channels, cudaStream_t stream);
// The residual add before a LayerNorm in one pass: residual (N,channels) = a + b (rounded to E),
// out = LayerNorm(residual); bit for bit residual_forward then layernorm_forward.
template <typename E>
void residual_layernorm_forward(E* residual, E* out, float* mean, float* rstd, const E* a,
                                const E* b, const E* weight, const E* bias, int N, int channels,
                                cudaStream_t stream);
// dinp (N,channels) +=, dweight, dbias (channels) += (of any type: parameter gradients may be
// fp32); `scratch` holds layernorm_backward_scratch(N, channels) floats.
template <typename E>
void layernorm_backward(E* dinp, Ptr dweight, Ptr dbias, float* scratch, const E* dout,
                        const E* inp, const E* weight, const float* mean, const float* rstd, int N,
                        int channels, cudaStream_t stream);
std::size_t layernorm_backward_scratch(int N, int channels);

// ---- Llama's layer: RMSNorm (rmsnorm.cu), rotary positions (rotary.cu), SwiGLU (swiglu.cu) --
// rstd (N) fp32 = 1 / sqrt(mean_c(inp^2) + eps); out (N,channels) = inp * rstd * weight.
template <typename E>
void rmsnorm_forward(E* out, float* rstd, const E* inp, const E* weight, int N, int channels,
                     float eps, cudaStream_t stream);
// dinp (N,channels) += unless null, dweight (channels, any type: parameter gradients may be fp32)
// += unless null; `scratch` holds rmsnorm_backward_scratch(N, channels) floats.
template <typename E>
void rmsnorm_backward(E* dinp, Ptr dweight, float* scratch, const E* dout, const E* inp,
                      const E* weight, const float* rstd, int N, int channels, cudaStream_t stream);
std::size_t rmsnorm_backward_scratch(int N, int channels);
// out (B,T,3·NH·hs) from qkv (B,T,(NH + 2·KVH)·hs); positions (T, device) or null (kernels/ops.h,
// rotary_qkv_forward).
template <typename E>
void rotary_qkv_forward(E* out, const E* qkv, int B, int T, int NH, int KVH, int hs, float theta,
                        const int32_t* positions, cudaStream_t stream);
// dqkv (B,T,(NH + 2·KVH)·hs) += the gradient from dout (B,T,3·NH·hs).
template <typename E>
void rotary_qkv_backward(E* dqkv, const E* dout, int B, int T, int NH, int KVH, int hs, float theta,
                         const int32_t* positions, cudaStream_t stream);
// out (N,F) = silu(gate) * up, inp (N,2F) each row's gate then up.
template <typename E>
void swiglu_forward(E* out, const E* inp, int N, int F, cudaStream_t stream);
template <typename E>  // dinp (N,2F) += the gradients of gate and up from dout (N,F)
void swiglu_backward(E* dinp, const E* inp, const E* dout, int N, int F, cudaStream_t stream);

// ---- linear: the bias gradient (bias_grad.cu); the GEMMs are cuBLASLt's (gemm.h) ----------
// dbias (OC, any type) += column sums of dout (N,OC); `scratch` holds bias_grad_scratch(N, OC)
// floats.
template <typename E>
void bias_grad(Ptr dbias, float* scratch, const E* dout, int N, int OC, cudaStream_t stream);
std::size_t bias_grad_scratch(int N, int OC);

// ---- embedding (embedding.cu) --------------------------------------------------------------
template <typename E>
void embedding_forward(E* out, const int32_t* tokens, const E* wte, const E* wpe, int B, int T,
                       int channels, int vocab_begin, int vocab_local, const int32_t* positions,
                       cudaStream_t stream);
// The scatter into dwte is a reduction wherever a token repeats: the positions sorted by
// token, one block per token sums that token's rows in position order and adds the sum once:
// no atomics, so the result does not depend on scheduling. dwte, dwpe of any type; `scratch`
// holds embedding_backward_scratch(B*T, vocab_local) bytes, 256-byte aligned.
template <typename E>
void embedding_backward(Ptr dwte, Ptr dwpe, void* scratch, const E* dout, const int32_t* tokens,
                        int B, int T, int channels, int vocab_begin, int vocab_local,
                        const int32_t* positions, cudaStream_t stream);
std::size_t embedding_backward_scratch(int N, int vocab_local);

// ---- vocab-parallel cross-entropy (cross_entropy.cu) ---------------------------------------
template <typename E>
void cross_entropy_partials(float* row_max, float* row_sumexp, float* target_logit, const E* logits,
                            const int32_t* targets, int N, int vocab_begin, int V, int Vp_local,
                            cudaStream_t stream);
void cross_entropy_rescale(float* row_sumexp, const float* row_max, const float* global_max, int N,
                           cudaStream_t stream);
void cross_entropy_losses(float* losses, float* lse, const float* global_max,
                          const float* row_sumexp, const float* target_logit, int N,
                          cudaStream_t stream);
// *total (device) += the mean of losses (N) in double, rounded to fp32 (Ops::add_mean).
void add_mean(double* total, const float* losses, int N, cudaStream_t stream);
template <typename E>  // dlogits may be logits
void cross_entropy_backward(E* dlogits, const E* logits, const float* lse, const int32_t* targets,
                            float dloss, int N, int vocab_begin, int V, int Vp_local,
                            cudaStream_t stream);

// ---- optimizer (optimizer.cu) ----------------------------------------------------------------
// Sum of squares in double added to *total (device), in a fixed order: per-block partials
// over fixed ranges, then one block adds them. `scratch` holds sum_of_squares_scratch() doubles.
template <typename E>
void add_sum_of_squares(double* total, double* scratch, const E* x, std::size_t count,
                        cudaStream_t stream);
std::size_t sum_of_squares_scratch();
// AdamW on fp32 master weights (kernels/ops.h); params (any type, may be null) receive the
// updated master weights rounded.
template <typename G, typename P>
void adamw_update(float* master, const G* grads, float* m, float* v, std::size_t count, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int step,
                  float grad_scale, P* params, cudaStream_t stream);

// ---- the whole-matrix optimizers (matrix_optimizers.cu) ------------------------------------
// Muon's momentum and its input U (kernels/ops.h, muon_momentum).
template <typename G>
void muon_momentum(float* u, float* momentum, const G* grads, std::size_t count, float mu,
                   bool nesterov, float grad_scale, cudaStream_t stream);
// The step along a direction: Muon's (kernels/ops.h, muon_update), or with decay_after
// GaLore's (galore_update); params (null: none) the master weights rounded.
template <typename P>
void matrix_update(float* master, const float* direction, std::size_t count, float lr,
                   float weight_decay, bool decay_after, P* params, cudaStream_t stream);

}  // namespace trident::kernels::cuda
