// The op set: every computation the GPT model and the optimizer perform, declared once.
//
// Model code calls these through an `Ops` object and never branches on the device; the CPU
// backend (kernels/cpu/) implements them with OpenBLAS and fused loops, and a CUDA backend
// implements the same virtual functions on device buffers. The virtual call is the one seam
// between model and device: it costs nothing next to an op's work.
//
// Conventions shared by every op:
// - Tensors are dense, row-major fp32 buffers owned by the caller, on the backend's device.
// - Shapes use B (batch), T (sequence), C (channels), OC (output channels), NH (heads),
//   N (rows = B*T), Vp (padded vocabulary), V (real vocabulary, V <= Vp).
// - Forward ops overwrite their outputs.
// - Backward ops ADD (+=) into every gradient they produce, parameters and activations alike,
//   so callers zero gradient buffers once and let contributions accumulate (residual
//   branches, tied embeddings, gradient accumulation over microbatches).
// - Linear weights use the [out, in] layout (y = x W^T + b), as torch.nn.Linear.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/random.h"

namespace trident::kernels {

class Ops {
public:
    virtual ~Ops() = default;

    virtual const char* name() const = 0;

    // ---- memory -------------------------------------------------------------------------
    virtual float* allocate(std::size_t count) = 0;           // zero-filled
    virtual void release(float* buffer) = 0;
    virtual void copy_to_host(float* host, const float* device, std::size_t count) = 0;
    virtual void copy_from_host(float* device, const float* host, std::size_t count) = 0;
    virtual void zero(float* x, std::size_t count) = 0;
    virtual void copy(float* out, const float* in, std::size_t count) = 0;

    // ---- embedding ----------------------------------------------------------------------
    // out (B,T,C) = wte[tokens[b,t]] + wpe[t]; tokens (B,T); wte (Vp,C); wpe (>=T,C)
    virtual void embedding_forward(float* out, const int32_t* tokens, const float* wte,
                                   const float* wpe, int B, int T, int C) = 0;
    // dwte (Vp,C) += scatter of dout by token; dwpe (T,C) += sum over batch of dout
    virtual void embedding_backward(float* dwte, float* dwpe, const float* dout,
                                    const int32_t* tokens, int B, int T, int C) = 0;

    // ---- layer norm (eps 1e-5) ----------------------------------------------------------
    // out (N,C); mean, rstd (N) saved for backward; weight, bias (C)
    virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                   const float* weight, const float* bias, int N, int C) = 0;
    virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                    const float* inp, const float* weight, const float* mean,
                                    const float* rstd, int N, int C) = 0;

    // ---- linear -------------------------------------------------------------------------
    // out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC); bias may be null
    virtual void matmul_forward(float* out, const float* inp, const float* weight,
                                const float* bias, int N, int C, int OC) = 0;
    // dinp (N,C) += dout @ weight; dweight (OC,C) += dout^T @ inp; dbias (OC) += column sums.
    // dinp and dbias may be null (not needed).
    virtual void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                 const float* inp, const float* weight, int N, int C, int OC) = 0;

    // ---- causal self-attention ----------------------------------------------------------
    // qkv (B,T,3C) holds q, k, v side by side, each (B,T,NH,hs) with hs = C/NH.
    // att (B,NH,T,T) receives the softmax probabilities (before dropout; the upper triangle
    // is zero); out (B,T,C) = dropout(att) @ v, heads concatenated. Scale 1/sqrt(hs).
    // Dropout on the probabilities uses drop_prob and seed (see dropout_forward); pass
    // drop_prob 0 for none.
    virtual void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C,
                                   int NH, float drop_prob, uint64_t seed) = 0;
    // dqkv (B,T,3C) += gradient; scratch (B,NH,T,T) is workspace, overwritten.
    virtual void attention_backward(float* dqkv, float* scratch, const float* dout,
                                    const float* qkv, const float* att, int B, int T, int C,
                                    int NH, float drop_prob, uint64_t seed) = 0;

    // ---- pointwise ----------------------------------------------------------------------
    // GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    virtual void gelu_forward(float* out, const float* inp, std::size_t count) = 0;
    virtual void gelu_backward(float* dinp, const float* inp, const float* dout,
                               std::size_t count) = 0;
    // out = a + b
    virtual void residual_forward(float* out, const float* a, const float* b,
                                  std::size_t count) = 0;
    // Inverted dropout: element i is kept when dropout_keep(seed, i, drop_prob) (below) and
    // scaled by 1/(1-p). The mask is a pure function of (seed, i): backward recomputes it, so
    // nothing is stored and every backend draws the same mask.
    virtual void dropout_forward(float* out, const float* inp, std::size_t count, float drop_prob,
                                 uint64_t seed) = 0;
    virtual void dropout_backward(float* dinp, const float* dout, std::size_t count,
                                  float drop_prob, uint64_t seed) = 0;

    // ---- loss ---------------------------------------------------------------------------
    // logits (N,Vp); only columns < V take part in the softmax. losses (N) = logsumexp - logit
    // of the target; lse (N) saved for backward. targets (N) in [0, V).
    virtual void cross_entropy_forward(float* losses, float* lse, const float* logits,
                                       const int32_t* targets, int N, int V, int Vp) = 0;
    // dlogits (N,Vp) = (softmax - onehot(target)) * dloss for columns < V, 0 for padded
    // columns. Overwrites (not +=): it is the start of the backward pass. dlogits may alias
    // logits.
    virtual void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                                        const int32_t* targets, float dloss, int N, int V,
                                        int Vp) = 0;

    // ---- optimizer ----------------------------------------------------------------------
    // Sum of squares in double, for the global gradient norm.
    virtual double sum_of_squares(const float* x, std::size_t count) = 0;
    virtual void scale(float* x, std::size_t count, float factor) = 0;
    // torch.optim.AdamW on one contiguous range: decoupled decay param -= lr*wd*param, then
    // the bias-corrected Adam step. step is 1-based.
    virtual void adamw_update(float* params, const float* grads, float* m, float* v,
                              std::size_t count, float lr, float beta1, float beta2, float eps,
                              float weight_decay, int step) = 0;
};

// The CPU backend, using `threads` threads for its loops and for OpenBLAS (0: all cores).
std::unique_ptr<Ops> make_cpu_ops(int threads);

// Dropout's mask, shared by every backend: a pure function of (seed, index), so the mask is
// reproducible anywhere without storing it. Returns true when the element is kept.
inline bool dropout_keep(uint64_t seed, uint64_t index, float drop_prob) {
    return uniform_float(seed, index) >= drop_prob;
}

}  // namespace trident::kernels
