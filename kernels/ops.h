// The op set: every computation the GPT model and the optimizer perform, declared once.
//
// Model code calls these through an `Ops` object and never branches on the device; the CPU
// backend (kernels/cpu/) implements them with OpenBLAS and fused loops, and a CUDA backend
// implements the same virtual functions on device buffers. The virtual call is the one seam
// between model and device: it costs nothing next to an op's work.
//
// Conventions shared by every op:
// - Tensors are dense, row-major buffers owned by the caller, on the backend's device.
//   Parameters, activations and gradients are typed pointers (Ptr, ConstPtr: fp32, bf16 or
//   fp16, each argument its own type); an op reads 16-bit inputs widened to fp32, computes
//   in fp32 and rounds what it writes to its output's type (dtype.h). Statistics (LayerNorm
//   mean/rstd, the loss's per-row numbers) and the optimizer's state are always fp32: float*.
// - Shapes use B (batch), T (sequence), channels (a row's width, docs/ARCHITECTURE.md
//   "Vocabulary"), OC (output channels), NH (heads),
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

#include "kernels/dtype.h"
#include "kernels/nf4_format.h"
#include "kernels/random.h"

namespace trident::kernels {

// One block of ring attention (Ops::attention_block_forward): B sequences, this rank's channels
// channels and NH heads; query rows [q_begin, q_begin + q_count) of q_rows, the first at
// sequence position q_position; key rows [k_begin, k_begin + k_count) of kv_rows, the first
// at k_position; attention dropout over the whole sequence of seq_len tokens.
struct AttentionBlock {
    int B = 0, channels = 0, NH = 0;
    int q_rows = 0, q_begin = 0, q_count = 0, q_position = 0;
    int kv_rows = 0, k_begin = 0, k_count = 0, k_position = 0;
    int seq_len = 0;
    float drop_prob = 0.0f;
    uint64_t seed = 0;
    int head_begin = 0, heads_total = 0;
    // Within documents (data.documents: mask): the sequence position where each of the q_rows
    // query rows' document starts (B, q_rows), on the device; a key is then visible only from
    // there. Null: from position 0.
    const int32_t* q_starts = nullptr;
};

class Ops {
public:
    virtual ~Ops() = default;

    virtual const char* name() const = 0;

    // ---- memory -------------------------------------------------------------------------
    virtual Ptr allocate(std::size_t count, DType dtype) = 0;  // zero-filled
    virtual void release(void* buffer) = 0;
    // Bytes allocated now and at most so far, as the allocator counts them.
    virtual std::size_t allocated_bytes() const = 0;
    virtual std::size_t peak_allocated_bytes() const = 0;
    // Starts the peak again from what is allocated now.
    virtual void reset_peak_allocated_bytes() = 0;
    // Host memory the device copies to and from fastest, zero-filled: page-locked on a GPU
    // backend (cudaMallocHost), plain on the CPU. Not counted in allocated_bytes (it is not the
    // device's); given back with release_host.
    virtual void* allocate_host(std::size_t bytes) = 0;
    virtual void release_host(void* buffer) = 0;
    // Raw bytes between host and device. upload returns once `host` may be reused; the copy is
    // ordered after the ops queued before it and before those queued after it, and may not have
    // happened yet (a GPU backend need not wait for its device). download returns with the
    // bytes in `host`.
    virtual void upload(void* device, const void* host, std::size_t bytes) = 0;
    virtual void download(void* host, const void* device, std::size_t bytes) = 0;
    // As fp32 on the host: widened from, or rounded into, the device buffer's type.
    void copy_to_host(float* host, ConstPtr device, std::size_t count);
    void copy_from_host(Ptr device, const float* host, std::size_t count);
    // The same through `staging`, host memory of count 16-bit elements, for a 16-bit buffer
    // (unused for fp32 ones): no allocation, and page-locked staging where it is.
    void copy_to_host(float* host, ConstPtr device, std::size_t count, uint16_t* staging);
    void copy_from_host(Ptr device, const float* host, std::size_t count, uint16_t* staging);
    virtual void zero(Ptr x, std::size_t count) = 0;
    // out = in, both of one type.
    virtual void copy(Ptr out, ConstPtr in, std::size_t count) = 0;
    // out = in rounded to out's type (or widened).
    virtual void convert(Ptr out, ConstPtr in, std::size_t count) = 0;

    // out (rows, cols), each row `out_stride` elements after the previous = in (rows, cols)
    // with rows `in_stride` apart, rounded to out's type (or widened): a block of columns
    // moved between row-major tensors (context parallelism's packing for its exchanges).
    // out and in must not overlap.
    virtual void copy_2d(Ptr out, std::size_t out_stride, ConstPtr in, std::size_t in_stride,
                         std::size_t rows, std::size_t cols) = 0;

    // ---- embedding ----------------------------------------------------------------------
    // Vocab-parallel: wte holds rows [vocab_begin, vocab_begin + vocab_local) of the padded
    // vocabulary. out (B,T,channels) = wte[tokens[b,t] - vocab_begin] (zero for a token outside the
    // slice: its row lives on another tensor-parallel rank) + wpe[positions[t]]; tokens
    // (B,T); wte (vocab_local, channels); wpe (wpe_rows, channels) or null (not added). positions
    // (T), on the device, are the sequence positions of the T rows (distinct, each < wpe_rows: a
    // context-parallel rank's tokens), or null for 0 .. T-1.
    virtual void embedding_forward(Ptr out, const int32_t* tokens, ConstPtr wte, ConstPtr wpe,
                                   int B, int T, int channels, int vocab_begin, int vocab_local,
                                   const int32_t* positions, int wpe_rows) = 0;
    // dwte (vocab_local, channels) += scatter of dout by in-slice token; dwpe (wpe_rows, channels)
    // at the rows' positions += sum over the batch of dout, unless dwpe is null.
    virtual void embedding_backward(Ptr dwte, Ptr dwpe, ConstPtr dout, const int32_t* tokens, int B,
                                    int T, int channels, int vocab_begin, int vocab_local,
                                    const int32_t* positions, int wpe_rows) = 0;

    // ---- layer norm (eps 1e-5) ----------------------------------------------------------
    // out (N,channels); mean, rstd (N) saved for backward; weight, bias (channels)
    virtual void layernorm_forward(Ptr out, float* mean, float* rstd, ConstPtr inp, ConstPtr weight,
                                   ConstPtr bias, int N, int channels) = 0;
    // dinp (N,channels) += the input's gradient, unless dinp is null; dweight, dbias (channels) +=
    // the parameters', unless they are null (both or neither). A backward split into an input step
    // and a weight step calls it once for each, with the results of one call.
    virtual void layernorm_backward(Ptr dinp, Ptr dweight, Ptr dbias, ConstPtr dout, ConstPtr inp,
                                    ConstPtr weight, const float* mean, const float* rstd, int N,
                                    int channels) = 0;

    // ---- Llama's layer ----------------------------------------------------------------
    // RMSNorm (Hugging Face's LlamaRMSNorm, fp32): out (N,channels) = inp * rstd * weight, rstd (N)
    // = 1/sqrt(mean_c(inp^2) + eps) saved for backward.
    virtual void rmsnorm_forward(Ptr out, float* rstd, ConstPtr inp, ConstPtr weight, int N,
                                 int channels, float eps) = 0;
    // dinp (N,channels) += the input's gradient, dweight (channels) += the weight's, each unless
    // null.
    virtual void rmsnorm_backward(Ptr dinp, Ptr dweight, ConstPtr dout, ConstPtr inp,
                                  ConstPtr weight, const float* rstd, int N, int channels) = 0;
    // Rotary positions and grouped key/value heads. qkv (B,T,(NH + 2·KVH)·hs) holds q of NH
    // heads, then k and v of KVH heads; out (B,T,3·NH·hs) is the qkv attention_forward reads:
    // q rotated, and query head h given k (rotated) and v of key/value head h / (NH/KVH).
    // The row of token t sits at sequence position positions[t] (T, on the device; null: t).
    // Hugging Face's rotate-half: for i < hs/2 and angle a = position · theta^(−2i/hs), in
    // fp32, x'[i] = x[i] cos a − x[i + hs/2] sin a, x'[i + hs/2] = x[i + hs/2] cos a + x[i] sin a.
    virtual void rotary_qkv_forward(Ptr out, ConstPtr qkv, int B, int T, int NH, int KVH, int hs,
                                    float theta, const int32_t* positions) = 0;
    // dqkv (B,T,(NH + 2·KVH)·hs) += the gradient of qkv from dout (B,T,3·NH·hs): rotated back,
    // each key/value head's the sum over its query heads.
    virtual void rotary_qkv_backward(Ptr dqkv, ConstPtr dout, int B, int T, int NH, int KVH, int hs,
                                     float theta, const int32_t* positions) = 0;
    // SwiGLU: out (N,F) = silu(gate) * up, from inp (N,2F) holding each row's gate then up.
    virtual void swiglu_forward(Ptr out, ConstPtr inp, int N, int F) = 0;
    // dinp (N,2F) += the gradients of gate and up from dout (N,F).
    virtual void swiglu_backward(Ptr dinp, ConstPtr inp, ConstPtr dout, int N, int F) = 0;

    // ---- linear -------------------------------------------------------------------------
    // out (N,OC) = inp (N,channels) @ weight (OC,channels)^T + bias (OC); bias may be null
    virtual void matmul_forward(Ptr out, ConstPtr inp, ConstPtr weight, ConstPtr bias, int N,
                                int channels, int OC) = 0;
    // dinp (N,channels) += dout @ weight; dweight (OC,channels) += dout^T @ inp; dbias (OC) +=
    // column sums. Each of dinp, dweight and dbias may be null (not needed): a backward split into
    // an input step and a weight step calls it once for each, with the results of one call.
    virtual void matmul_backward(Ptr dinp, Ptr dweight, Ptr dbias, ConstPtr dout, ConstPtr inp,
                                 ConstPtr weight, int N, int channels, int OC) = 0;
    // out (N,OC) += bias (OC): the bias of a row-parallel linear, added once after the
    // partial outputs are reduced.
    virtual void add_bias(Ptr out, ConstPtr bias, int N, int OC) = 0;

    // ---- grouped linear (a mixture of experts' experts, model/moe_mlp.cpp) ------------------
    // G groups of contiguous rows, each with its own weight and no bias: group g is rows
    // [offsets[g], offsets[g+1]) of the activations (offsets (G+1), on the host, ascending; a
    // group may be empty, N = offsets[G]) and weights[g] (OC,channels) its weight (G device
    // pointers, on the host). The results of matmul_forward and matmul_backward called
    // on each group's rows: the defaults (ops.cpp, the CPU backend's) make those calls, bit for
    // bit theirs; a GPU backend runs the groups as one grouped GEMM.
    // out (N,OC) = each group's inp (rows,channels) @ weights[g]^T.
    virtual void grouped_matmul_forward(Ptr out, ConstPtr inp, const ConstPtr* weights,
                                        const int32_t* offsets, int G, int channels, int OC);
    // dinp (N,channels) += each group's dout (rows,OC) @ weights[g]; dweights[g] (OC,channels) +=
    // dout^T @ inp of its rows. dinp, or dweights (G pointers on the host), may be null (not
    // needed), as in matmul_backward; weights is read for dinp only.
    virtual void grouped_matmul_backward(Ptr dinp, const Ptr* dweights, ConstPtr dout, ConstPtr inp,
                                         const ConstPtr* weights, const int32_t* offsets, int G,
                                         int channels, int OC);

    // ---- causal self-attention ----------------------------------------------------------
    // qkv (B,T,3·channels) holds q, k, v side by side, each (B,T,NH,hs) with hs = channels/NH;
    // under tensor parallelism channels and NH are this rank's share, heads head_begin ..
    // head_begin+NH-1 of heads_total. out (B,T,channels) = dropout(softmax(q k^T / sqrt(hs),
    // causal)) @ v, heads concatenated. Dropout on the probabilities (drop_prob 0: none) draws
    // element (b, head_begin + h, i, j) at index ((b*heads_total + head_begin + h)*T + i)*T + j, so
    // the mask does not depend on how heads are split over ranks.
    //
    // What forward keeps for backward, `saved`, is the backend's choice, as attention_saved
    // says for a problem of (B, NH, T) in activations of a given type: the CPU keeps the
    // probabilities before dropout (B,NH,T,T) in that type; flash attention on a GPU keeps
    // one fp32 log-sum-exp per row (B,NH,T) and never writes the T x T scores.
    struct AttentionSaved {
        std::size_t count;
        DType dtype;
    };
    virtual AttentionSaved attention_saved(int B, int NH, int T, DType activations) const = 0;
    virtual void attention_forward(Ptr out, Ptr saved, ConstPtr qkv, int B, int T, int channels,
                                   int NH, float drop_prob, uint64_t seed, int head_begin,
                                   int heads_total) = 0;
    // dqkv (B,T,3·channels) += gradient, given the forward's out and saved (any workspace is the
    // backend's own).
    virtual void attention_backward(Ptr dqkv, ConstPtr dout, ConstPtr qkv, ConstPtr out,
                                    ConstPtr saved, int B, int T, int channels, int NH,
                                    float drop_prob, uint64_t seed, int head_begin,
                                    int heads_total) = 0;
    // saved alone, bit for bit as attention_forward writes it: selective recompute rebuilds
    // it for backward instead of keeping it. It needs no dropout mask (so no seed or
    // head_begin), but drop_prob is the forward's: a backend whose choice of kernel depends
    // on it (the GPU's: cuDNN without dropout, its own kernels with) rebuilds with the kernel
    // the forward ran.
    virtual void attention_rebuild(Ptr saved, ConstPtr qkv, int B, int T, int channels, int NH,
                                   float drop_prob) = 0;

    // ---- attention within documents (data.documents: mask, model/documents.h) ------------
    // attention_forward, _backward and _rebuild with key j visible to query i of sequence b
    // only when starts[b·T + i] <= j <= i: starts (B·T, int32, on the device) the first row of
    // each row's document within its sequence (0 at a sequence's first row; a row starting a
    // document is its own start). saved is attention_saved's; dropout draws attention_forward's
    // elements. Null starts: one document a sequence, attention_forward's causal attention (the
    // defaults below call it); a backend without the document kernels refuses others by name
    // (the CPU's are the reference).
    virtual void document_attention_forward(Ptr out, Ptr saved, ConstPtr qkv, const int32_t* starts,
                                            int B, int T, int channels, int NH, float drop_prob,
                                            uint64_t seed, int head_begin, int heads_total);
    virtual void document_attention_backward(Ptr dqkv, ConstPtr dout, ConstPtr qkv, ConstPtr out,
                                             ConstPtr saved, const int32_t* starts, int B, int T,
                                             int channels, int NH, float drop_prob, uint64_t seed,
                                             int head_begin, int heads_total);
    virtual void document_attention_rebuild(Ptr saved, ConstPtr qkv, const int32_t* starts, int B,
                                            int T, int channels, int NH, float drop_prob);

    // ---- attention against a key/value cache (generation, model/kv_cache.h) ---------------
    // New tokens at positions first .. first+rows-1 of one sequence. qkv (rows, 3·NH·hs) as
    // attention_forward reads it; the k and v of key/value head g (query head g·(NH/KVH)'s in
    // qkv) are written to k_cache and v_cache (seq_len, KVH·hs) at each row's position, then
    // out (rows, NH·hs) = softmax(q kᵀ / sqrt(hs)) v over the cache's positions 0 .. the
    // row's own, query head h reading key/value head h / (NH/KVH). fp32.
    virtual void cached_attention_forward(Ptr out, Ptr k_cache, Ptr v_cache, ConstPtr qkv, int rows,
                                          int first, int NH, int KVH, int hs) = 0;

    // ---- ring attention (context parallelism) -------------------------------------------
    // Causal attention between a block of query rows and a block of key rows of the same
    // sequences, as ring attention computes it piece by piece (Liu et al. 2023): the
    // queries of this rank's tokens against the keys and values of some rank's tokens
    // (AttentionBlock above). qkv (B, q_rows, 3·channels) holds this rank's q, k, v as
    // attention_forward reads them; kv (B, kv_rows, 2·channels) the k and v, side by side, of the
    // tokens held. Key j is visible to query i when k_position + j <= q_position + i (and, within
    // documents, k_position + j >= the row's q_starts).
    // Attention dropout draws element (b, head_begin + h, position of i, position of j) of
    // the whole sequence's (B, heads_total, seq_len, seq_len): the index attention_forward
    // draws, so the masks do not depend on the split.
    //
    // On the block's query rows of out (B, q_rows, channels) and lse (B, NH, q_rows), both fp32
    // (overwritten): dropout(softmax over the block's visible keys) @ v, and each row's
    // log-sum-exp of its scaled visible scores (-inf, and out 0, where no key is visible).
    virtual void attention_block_forward(float* out, float* lse, ConstPtr qkv, ConstPtr kv,
                                         const AttentionBlock& block) = 0;
    // Merges a block's result into the running one on rows [row_begin, row_begin + row_count)
    // of out (B, rows, channels) and lse (B, NH, rows): lse' = log(e^lse + e^block_lse), out' =
    // out e^(lse - lse') + block_out e^(block_lse - lse'), both fp32; a row where either lse
    // is -inf takes the other side as it is (the online softmax, by whole blocks).
    virtual void attention_merge(float* out, float* lse, const float* block_out,
                                 const float* block_lse, int B, int rows, int channels, int NH,
                                 int row_begin, int row_count) = 0;
    // The block's backward, given the whole attention's output out (B, q_rows, channels) and its
    // lse (B, NH, q_rows) (over all key blocks) and the output's gradient dout: dq
    // (B, q_rows, channels) and dkv (B, kv_rows, 2·channels) += the gradients of the block's q and
    // k, v, both fp32 (dk, dv travel back around the ring in fp32).
    virtual void attention_block_backward(float* dq, float* dkv, ConstPtr dout, ConstPtr qkv,
                                          ConstPtr kv, ConstPtr out, const float* lse,
                                          const AttentionBlock& block) = 0;

    // ---- pointwise ----------------------------------------------------------------------
    // GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    virtual void gelu_forward(Ptr out, ConstPtr inp, std::size_t count) = 0;
    virtual void gelu_backward(Ptr dinp, ConstPtr inp, ConstPtr dout, std::size_t count) = 0;
    // out = a + b
    virtual void residual_forward(Ptr out, ConstPtr a, ConstPtr b, std::size_t count) = 0;
    // out = max(inp, 0); out may be inp.
    virtual void relu_forward(Ptr out, ConstPtr inp, std::size_t count) = 0;
    // out = a * b * factor, element by element; out may be a or b.
    virtual void multiply(Ptr out, ConstPtr a, ConstPtr b, std::size_t count, float factor) = 0;
    // out (rows, cols) = inp (rows, cols) with row i times factors[i] (rows fp32, on the
    // device); out may be inp. Each element is the product multiply forms.
    virtual void scale_rows(Ptr out, ConstPtr inp, const float* factors, std::size_t rows,
                            std::size_t cols) = 0;
    // Inverted dropout: element i is kept when dropout_keep(seed, index_begin + i, drop_prob)
    // (below) and scaled by 1/(1-p). The mask is a pure function of (seed, index): backward
    // recomputes it, so nothing is stored and every backend, and every split of the rows
    // over ranks (index_begin = the first row's global element index), draws the same mask.
    virtual void dropout_forward(Ptr out, ConstPtr inp, std::size_t count, float drop_prob,
                                 uint64_t seed, uint64_t index_begin) = 0;
    virtual void dropout_backward(Ptr dinp, ConstPtr dout, std::size_t count, float drop_prob,
                                  uint64_t seed, uint64_t index_begin) = 0;

    // ---- loss: vocab-parallel softmax cross-entropy --------------------------------------
    // logits (N,Vp_local) are the columns [vocab_begin, vocab_begin + Vp_local) of the padded
    // vocabulary; columns at or past V (the real vocabulary) are padding and never take part.
    // The full logits are never gathered: each rank reduces its slice to three numbers per
    // row, which are combined over the tensor-parallel ranks (Megatron's vocab-parallel
    // cross-entropy):
    //   1. partials: row_max (N) = max of the slice's real columns (-inf if it has none),
    //      row_sumexp (N) = sum of exp(logit - row_max) over them (0 if none),
    //      target_logit (N) = the target's logit if the target is in the slice, else 0.
    //   2. (caller: global_max = all-reduce max of row_max)
    //      rescale: row_sumexp *= exp(row_max - global_max)
    //   3. (caller: all-reduce sum of row_sumexp and of target_logit)
    //      losses: lse (N) = global_max + log(row_sumexp); losses (N) = lse - target_logit.
    // targets (N) are global ids in [0, V). Everything but the logits is fp32.
    virtual void cross_entropy_partials(float* row_max, float* row_sumexp, float* target_logit,
                                        ConstPtr logits, const int32_t* targets, int N,
                                        int vocab_begin, int V, int Vp_local) = 0;
    virtual void cross_entropy_rescale(float* row_sumexp, const float* row_max,
                                       const float* global_max, int N) = 0;
    virtual void cross_entropy_losses(float* losses, float* lse, const float* global_max,
                                      const float* row_sumexp, const float* target_logit,
                                      int N) = 0;
    // dlogits (N,Vp_local) = (exp(logit - lse) - [vocab_begin + column == target]) * dloss
    // for real columns, 0 for padding. Overwrites (not +=): it starts the backward pass.
    // dlogits may alias logits.
    virtual void cross_entropy_backward(Ptr dlogits, ConstPtr logits, const float* lse,
                                        const int32_t* targets, float dloss, int N, int vocab_begin,
                                        int V, int Vp_local) = 0;

    // The step's loss: total (one double, on the device) += the mean of losses (N), summed
    // in double in row order and rounded to fp32 (a microbatch's mean loss). The step's
    // microbatches add into one total that the host reads once, after the last.
    virtual void add_mean(double* total, const float* losses, int N) = 0;

    // ---- a 4-bit frozen base (training.lora.quantize: nf4, kernels/nf4.h) -----------------
    // out (m.count) = the NF4 code book's value of each element's code · its block's absmax
    // (nf4_absmax under double quantization), in fp32, rounded to out's type: bit for bit
    // kernels::nf4_dequantize's, on every backend.
    virtual void nf4_dequantize(Ptr out, const Nf4Matrix& m) = 0;

    // ---- optimizer ----------------------------------------------------------------------
    // total (one double, on the device) += the sum of squares of x in double, for the global
    // gradient norm: inf or NaN if any element is. Every buffer's sum lands in one total that
    // the host reads once (no transfer, and so no wait for the device, per buffer).
    virtual void add_sum_of_squares(double* total, ConstPtr x, std::size_t count) = 0;
    // The sum of squares of one buffer, read back at once (ops.cpp).
    double sum_of_squares(ConstPtr x, std::size_t count);
    virtual void scale(Ptr x, std::size_t count, float factor) = 0;
    // torch.optim.AdamW on one contiguous range of fp32 master weights, with the gradient
    // g = grads * grad_scale (unscaling and clipping folded into one factor): decoupled decay
    // master -= lr*wd*master, then the bias-corrected Adam step. step is 1-based. The
    // updated master weights are also written, rounded, to `params` (the model's working
    // copy, any type) in the same pass, unless it is null.
    virtual void adamw_update(float* master, ConstPtr grads, float* m, float* v, std::size_t count,
                              float lr, float beta1, float beta2, float eps, float weight_decay,
                              int step, float grad_scale, Ptr params) = 0;

    // ---- the whole-matrix optimizers' element work (optim/muon.h, optim/galore.h) ----------
    // Muon's momentum on one contiguous range, g = grads * grad_scale: momentum = mu·momentum
    // + g, then u = g + mu·momentum (nesterov) or momentum. All fp32 but grads (any type).
    virtual void muon_momentum(float* u, float* momentum, ConstPtr grads, std::size_t count,
                               float mu, bool nesterov, float grad_scale) = 0;
    // Muon's step along `direction` (scale·O, fp32): master = w − lr·wd·w − lr·direction, w the
    // master weight before it, rounded also into `params` unless it is null.
    virtual void muon_update(float* master, const float* direction, std::size_t count, float lr,
                             float weight_decay, Ptr params) = 0;
    // GaLore's step along `direction` (its learning rate folded in), then the decay:
    // w = master − direction, master = w − lr·wd·w; rounded also into `params` unless null.
    virtual void galore_update(float* master, const float* direction, std::size_t count, float lr,
                               float weight_decay, Ptr params) = 0;
    // Muon's Newton-Schulz iterations on x (rows, cols), rows <= cols, fp32, in place: `steps`
    // times M = X·Xᵀ, X = a·X + (b·M + c·M·M)·X, (a, b, c) = (3.4445, −4.7750, 2.0315).
    // precision fp32: every product in fp32. bf16: X rounded to bf16 first, then each GEMM's
    // inputs bf16, its fp32 sum (with the added term, read as bf16) rounded once to bf16, as a
    // bf16 GEMM with fp32 accumulation writes it: M = bf16(X·Xᵀ), P = bf16(c·M·M + b·M),
    // X = bf16(P·X + a·X) (docs/FORMULAS.md, "Muon"). The result is widened back into x.
    // `scratch`: newton_schulz_scratch(rows, cols) floats of the backend's memory, which the
    // iterations use for the next X and for M and P, so that they allocate nothing.
    virtual void newton_schulz(float* x, float* scratch, int rows, int cols, int steps,
                               DType precision) = 0;
};

// The CPU backend, using `threads` threads for its loops and for OpenBLAS (0: all cores), at
// most kernels/threads.h's bound.
std::unique_ptr<Ops> make_cpu_ops(int threads);
// What the CPU backend's attention keeps for its backward (Ops::attention_saved): the
// probabilities (B, NH, T, T) in the activations' type; its backward's workspace, their
// gradient, is as large. The planner counts a CPU run's memory by this rule.
Ops::AttentionSaved cpu_attention_saved(int B, int NH, int T, DType activations);

// The scratch of Ops::newton_schulz for x (rows, cols), in floats: the next X (rows, cols),
// M and P (rows, rows) each (bf16's each in half the bytes, x's own bytes holding an X).
inline std::size_t newton_schulz_scratch(int rows, int cols) {
    const auto r = static_cast<std::size_t>(rows), c = static_cast<std::size_t>(cols);
    return r * c + 2 * r * r;
}

// Dropout's mask, shared by every backend: a pure function of (seed, index), so the mask is
// reproducible anywhere without storing it. Returns true when the element is kept.
inline bool dropout_keep(uint64_t seed, uint64_t index, float drop_prob) {
    return uniform_float(seed, index) >= drop_prob;
}

}  // namespace trident::kernels
