// The CPU backend's kernels as free functions, one family per .cpp file, plus the small
// vectorisable math they share. CpuOps (cpu_ops.cpp) forwards the Ops interface to these;
// shapes and the "+=" convention are those documented in kernels/ops.h.
//
// Determinism: every parallel loop gives each output element to exactly one thread, or
// combines per-chunk partials in a fixed order, so a run repeats bit for bit.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>

namespace trident::kernels {
struct AttentionBlock;  // kernels/ops.h
struct Nf4Matrix;       // kernels/nf4_format.h
}  // namespace trident::kernels

namespace trident::kernels::cpu {

// exp(x) written so GCC vectorises the loops that call it: std::exp is a libm call that blocks
// vectorisation unless the whole file is built with -ffast-math, and the softmax over 50k
// logits per row is dominated by exps. Range reduction x = n ln2 + r with |r| <= ln2/2, a
// degree-6 Taylor polynomial for e^r (relative error ~2e-7, a couple of ulp), and 2^n put
// straight into the exponent bits. Inputs are clamped to [-88, 88]: below about -87.7 the
// result is 0 (exp(-inf) included), which is what a softmax wants.
inline float fast_exp(float x) {
    constexpr float log2e = 1.44269504088896341f;
    constexpr float ln2_hi = 0.693359375f;  // few mantissa bits, so n * ln2_hi is exact
    constexpr float ln2_lo = -2.12194440e-4f;
    constexpr float round_magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to integer
    x = std::min(std::max(x, -88.0f), 88.0f);
    const float n = (x * log2e + round_magic) - round_magic;
    const float r = (x - n * ln2_hi) - n * ln2_lo;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    // n is in [-127, 127]; n = -127 gives exponent bits 0, i.e. a scale of 0.
    const float two_to_n = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
    return p * two_to_n;
}

// tanh through fast_exp; the absolute error (~2e-7) is what GELU needs, not relative error
// near 0.
inline float fast_tanh(float x) {
    return 1.0f - 2.0f / (fast_exp(2.0f * x) + 1.0f);
}

// ---- embedding (embedding.cpp) ----------------------------------------------------------
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                       int T, int channels, int vocab_begin, int vocab_local,
                       const int32_t* positions);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int channels, int vocab_begin, int vocab_local,
                        const int32_t* positions);

// ---- layer norm (layernorm.cpp) ---------------------------------------------------------
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int channels);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int channels);

// ---- RMS norm (rmsnorm.cpp) -------------------------------------------------------------
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N,
                     int channels, float eps);
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int channels);

// ---- rotary positions and grouped key/value heads (rotary.cpp) ---------------------------
void rotary_qkv_forward(float* out, const float* qkv, int B, int T, int NH, int KVH, int hs,
                        float theta, const int32_t* positions);
void rotary_qkv_backward(float* dqkv, const float* dout, int B, int T, int NH, int KVH, int hs,
                         float theta, const int32_t* positions);

// ---- attention against a key/value cache (cached_attention.cpp) ---------------------------
void cached_attention_forward(float* out, float* k_cache, float* v_cache, const float* qkv,
                              int rows, int first, int NH, int KVH, int hs);

// ---- a 4-bit frozen base (nf4.cpp) ---------------------------------------------------------
void nf4_dequantize(float* out, const Nf4Matrix& m);  // out (m.count)

// ---- linear (matmul.cpp) ----------------------------------------------------------------
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int channels, int OC);
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int channels, int OC);
void add_bias(float* out, const float* bias, int N, int OC);

// ---- causal self-attention (attention.cpp), within documents where `starts` is given -----
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int channels, int NH,
                       float drop_prob, uint64_t seed, int head_begin, int heads_total,
                       const int32_t* starts);
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int channels, int NH, float drop_prob,
                        uint64_t seed, int head_begin, int heads_total, const int32_t* starts);
void attention_probs(float* att, const float* qkv, int B, int T, int channels, int NH,
                     const int32_t* starts);

// ---- ring attention's blocks (attention_block.cpp) --------------------------------------
void attention_block_forward(float* out, float* lse, const float* qkv, const float* kv,
                             const AttentionBlock& block);
void attention_merge(float* out, float* lse, const float* block_out, const float* block_lse, int B,
                     int rows, int channels, int NH, int row_begin, int row_count);
void attention_block_backward(float* dq, float* dkv, const float* dout, const float* qkv,
                              const float* kv, const float* out, const float* lse,
                              const AttentionBlock& block);

// ---- pointwise (pointwise.cpp) ----------------------------------------------------------
void gelu_forward(float* out, const float* inp, std::size_t count);
void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t count);
void swiglu_forward(float* out, const float* inp, int N, int F);
void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F);
void residual_forward(float* out, const float* a, const float* b, std::size_t count);
void relu_forward(float* out, const float* inp, std::size_t count);
void multiply(float* out, const float* a, const float* b, std::size_t count, float factor);
void scale_rows(float* out, const float* inp, const float* factors, std::size_t rows,
                std::size_t cols);
void dropout_forward(float* out, const float* inp, std::size_t count, float drop_prob,
                     uint64_t seed, uint64_t index_begin);
void dropout_backward(float* dinp, const float* dout, std::size_t count, float drop_prob,
                      uint64_t seed, uint64_t index_begin);

// ---- loss, vocab-parallel (cross_entropy.cpp) -------------------------------------------
void cross_entropy_partials(float* row_max, float* row_sumexp, float* target_logit,
                            const float* logits, const int32_t* targets, int N, int vocab_begin,
                            int V, int Vp_local);
void cross_entropy_rescale(float* row_sumexp, const float* row_max, const float* global_max, int N);
void cross_entropy_losses(float* losses, float* lse, const float* global_max,
                          const float* row_sumexp, const float* target_logit, int N);
// The mean of losses (N), summed in double in row order, rounded to fp32.
float mean(const float* losses, int N);
void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                            const int32_t* targets, float dloss, int N, int vocab_begin, int V,
                            int Vp_local);

// ---- optimizer (optimizer.cpp) ----------------------------------------------------------
double sum_of_squares(const float* x, std::size_t count);
void scale(float* x, std::size_t count, float factor);
void adamw_update(float* params, const float* grads, float* m, float* v, std::size_t count,
                  float lr, float beta1, float beta2, float eps, float weight_decay, int step,
                  float grad_scale, float* params_out);

// ---- the whole-matrix optimizers (matrix_optimizers.cpp) -------------------------------
void muon_momentum(float* u, float* momentum, const float* grads, std::size_t count, float mu,
                   bool nesterov, float grad_scale);
void muon_update(float* master, const float* direction, std::size_t count, float lr,
                 float weight_decay);
void galore_update(float* master, const float* direction, std::size_t count, float lr,
                   float weight_decay);
// x (rows, cols), rows <= cols, in place, through `scratch` (kernels/ops.h,
// newton_schulz_scratch); bf16: bf16's rounding emulated.
void newton_schulz(float* x, float* scratch, int rows, int cols, int steps, bool bf16);

}  // namespace trident::kernels::cpu
