// CudaOps: the Ops interface (kernels/ops.h) on the GPU. Each op picks its kernel by the
// element types of its arguments: one type throughout (fp32, bf16 or fp16; parameter
// gradients may be fp32 besides) runs the templated kernels of cuda_kernels.h directly; any
// other mix goes through fp32 views (fp32_views.h). Linear layers are LinearOps' cuBLASLt
// products (linear_ops.h), a mixture of experts' grouped ones cuBLAS's (grouped_gemm.h);
// attention is AttentionOps' (attention_ops.h): cuDNN's fused kernel where it is safe, else the
// built-in flash attention, one choice per shape kept for the run; Llama's RMSNorm, rotary
// positions and SwiGLU are LlamaOps' (llama_ops.h).
//
// Attention keeps no probabilities: what it saves for backward (attention_saved) is the
// per-row log-sum-exp (B,NH,T) in fp32, all that backward needs besides q, k, v and the
// forward's output.
#include "kernels/cuda/cuda_ops.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_ops.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/fp32_views.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/linear_ops.h"
#include "kernels/cuda/llama_ops.h"
#include "kernels/cuda/newton_schulz.h"
#include "kernels/cuda/upload_staging.h"
#include "kernels/error.h"
// The host's waits for the device are marked for the stall watchdog, since NCCL's collectives
// complete in them.
#include "kernels/host_wait.h"

namespace trident::kernels {
namespace {

using cuda::all_of_type;
using cuda::as;
using cuda::dispatch;
using cuda::Scratch;

class CudaOps final : public Ops {
public:
    explicit CudaOps(bool tf32)
        : stream_(cuda::compute_stream()),
          linear_(allocator_, stream_, tf32),
          attention_(allocator_, stream_),
          llama_(allocator_, stream_),
          uploads_(stream_),
          grouped_(allocator_, uploads_, stream_, tf32),
          newton_schulz_(allocator_, stream_) {}
    // Queued work may still use the memory the members give back.
    ~CudaOps() override { cudaStreamSynchronize(stream_); }

    const char* name() const override { return "cuda"; }

    // ---- memory ---------------------------------------------------------------------------
    Ptr allocate(std::size_t count, DType dtype) override {
        const std::size_t bytes = count * size_of(dtype);
        void* buffer = allocator_.allocate(bytes);
        if (bytes) TRIDENT_CUDA_CHECK(cudaMemsetAsync(buffer, 0, bytes, stream_));
        return Ptr(buffer, dtype);
    }
    void release(void* buffer) override { allocator_.release(buffer); }
    void* allocate_host(std::size_t bytes) override {
        void* buffer = nullptr;
        TRIDENT_CUDA_CHECK(cudaMallocHost(&buffer, std::max<std::size_t>(1, bytes)));
        std::memset(buffer, 0, bytes);
        return buffer;
    }
    // After the copies queued on it. Called from destructors, so unchecked: a failure here is
    // the device's, and its next checked call reports it.
    void release_host(void* buffer) override {
        cudaStreamSynchronize(stream_);
        cudaFreeHost(buffer);
    }
    std::size_t allocated_bytes() const override { return allocator_.allocated_bytes(); }
    std::size_t peak_allocated_bytes() const override { return allocator_.peak_allocated_bytes(); }
    void reset_peak_allocated_bytes() override { allocator_.reset_peak(); }
    // Through page-locked slots: returns without waiting for the compute queued before it.
    void upload(void* device, const void* host, std::size_t bytes) override {
        uploads_.upload(device, host, bytes);
    }
    void download(void* host, const void* device, std::size_t bytes) override {
        if (!bytes) return;
        TRIDENT_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream_));
        const HostWait wait;
        TRIDENT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    void zero(Ptr x, std::size_t count) override {
        if (count)
            TRIDENT_CUDA_CHECK(cudaMemsetAsync(x.data, 0, count * size_of(x.dtype), stream_));
    }
    void copy(Ptr out, ConstPtr in, std::size_t count) override {
        if (out.dtype != in.dtype)
            throw Error(std::string("internal: copy from ") + name_of(in.dtype) + " to " +
                        name_of(out.dtype) + "; convert changes types");
        if (count && out.data != in.data)
            TRIDENT_CUDA_CHECK(cudaMemcpyAsync(out.data, in.data, count * size_of(out.dtype),
                                               cudaMemcpyDeviceToDevice, stream_));
    }
    void convert(Ptr out, ConstPtr in, std::size_t count) override {
        if (out.dtype == in.dtype) return copy(out, in, count);
        dispatch(out.dtype, [&](auto to) {
            dispatch(in.dtype, [&](auto from) {
                using TOut = decltype(to);
                using TIn = decltype(from);
                cuda::convert(as<TOut>(out), as<TIn>(in), count, stream_);
            });
        });
    }

    void copy_2d(Ptr out, std::size_t out_stride, ConstPtr in, std::size_t in_stride,
                 std::size_t rows, std::size_t cols) override {
        if (out.dtype == in.dtype) {
            const std::size_t width = size_of(out.dtype);
            if (rows > 0 && cols > 0)
                TRIDENT_CUDA_CHECK(cudaMemcpy2DAsync(out.data, out_stride * width, in.data,
                                                     in_stride * width, cols * width, rows,
                                                     cudaMemcpyDeviceToDevice, stream_));
            return;
        }
        dispatch(out.dtype, [&](auto to) {
            dispatch(in.dtype, [&](auto from) {
                using TOut = decltype(to);
                using TIn = decltype(from);
                cuda::convert_2d(as<TOut>(out), out_stride, as<TIn>(in), in_stride, rows, cols,
                                 stream_);
            });
        });
    }

    // ---- embedding ------------------------------------------------------------------------
    void embedding_forward(Ptr out, const int32_t* tokens, ConstPtr wte, ConstPtr wpe, int B, int T,
                           int channels, int vocab_begin, int vocab_local, const int32_t* positions,
                           int wpe_rows) override {
        if (all_of_type(out.dtype, {wte, wpe})) {
            dispatch(out.dtype, [&](auto e) {
                using E = decltype(e);
                cuda::embedding_forward(as<E>(out), tokens, as<E>(wte), as<E>(wpe), B, T, channels,
                                        vocab_begin, vocab_local, positions, stream_);
            });
            return;
        }
        auto v = views();
        const std::size_t NC = static_cast<std::size_t>(B) * T * channels;
        cuda::embedding_forward(v.out(out, NC), tokens,
                                v.in(wte, std::size_t(vocab_local) * channels),
                                v.in(wpe, std::size_t(wpe_rows) * channels), B, T, channels,
                                vocab_begin, vocab_local, positions, stream_);
        v.commit();
    }
    void embedding_backward(Ptr dwte, Ptr dwpe, ConstPtr dout, const int32_t* tokens, int B, int T,
                            int channels, int vocab_begin, int vocab_local,
                            const int32_t* positions, int) override {
        // The gradients may be of any type; the kernel converts as it adds.
        const Scratch scratch(allocator_, cuda::embedding_backward_scratch(B * T, vocab_local));
        dispatch(dout.dtype, [&](auto e) {
            using E = decltype(e);
            cuda::embedding_backward(dwte, dwpe, scratch.data(), as<E>(dout), tokens, B, T,
                                     channels, vocab_begin, vocab_local, positions, stream_);
        });
    }

    // ---- layer norm ---------------------------------------------------------------------------
    void layernorm_forward(Ptr out, float* mean, float* rstd, ConstPtr inp, ConstPtr weight,
                           ConstPtr bias, int N, int channels) override {
        if (all_of_type(inp.dtype, {out, weight, bias})) {
            dispatch(inp.dtype, [&](auto e) {
                using E = decltype(e);
                cuda::layernorm_forward(as<E>(out), mean, rstd, as<E>(inp), as<E>(weight),
                                        as<E>(bias), N, channels, stream_);
            });
            return;
        }
        auto v = views();
        const std::size_t NC = static_cast<std::size_t>(N) * channels;
        cuda::layernorm_forward(v.out(out, NC), mean, rstd, v.in(inp, NC), v.in(weight, channels),
                                v.in(bias, channels), N, channels, stream_);
        v.commit();
    }
    void layernorm_backward(Ptr dinp, Ptr dweight, Ptr dbias, ConstPtr dout, ConstPtr inp,
                            ConstPtr weight, const float* mean, const float* rstd, int N,
                            int channels) override {
        const Scratch scratch(allocator_,
                              cuda::layernorm_backward_scratch(N, channels) * sizeof(float));
        if (all_of_type(inp.dtype, {dinp, dout, weight})) {
            dispatch(inp.dtype, [&](auto e) {
                using E = decltype(e);
                cuda::layernorm_backward(as<E>(dinp), dweight, dbias, scratch.floats(), as<E>(dout),
                                         as<E>(inp), as<E>(weight), mean, rstd, N, channels,
                                         stream_);
            });
            return;
        }
        auto v = views();
        const std::size_t NC = static_cast<std::size_t>(N) * channels;
        cuda::layernorm_backward(v.inout(dinp, NC), v.inout(dweight, channels),
                                 v.inout(dbias, channels), scratch.floats(), v.in(dout, NC),
                                 v.in(inp, NC), v.in(weight, channels), mean, rstd, N, channels,
                                 stream_);
        v.commit();
    }

    // ---- Llama's layer (llama_ops.h) -----------------------------------------------------
    void rmsnorm_forward(Ptr out, float* rstd, ConstPtr inp, ConstPtr weight, int N, int channels,
                         float eps) override {
        llama_.rmsnorm_forward(out, rstd, inp, weight, N, channels, eps);
    }
    void rmsnorm_backward(Ptr dinp, Ptr dweight, ConstPtr dout, ConstPtr inp, ConstPtr weight,
                          const float* rstd, int N, int channels) override {
        llama_.rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, channels);
    }
    void rotary_qkv_forward(Ptr out, ConstPtr qkv, int B, int T, int NH, int KVH, int hs,
                            float theta, const int32_t* positions) override {
        llama_.rotary_qkv_forward(out, qkv, B, T, NH, KVH, hs, theta, positions);
    }
    void rotary_qkv_backward(Ptr dqkv, ConstPtr dout, int B, int T, int NH, int KVH, int hs,
                             float theta, const int32_t* positions) override {
        llama_.rotary_qkv_backward(dqkv, dout, B, T, NH, KVH, hs, theta, positions);
    }
    void swiglu_forward(Ptr out, ConstPtr inp, int N, int F) override {
        llama_.swiglu_forward(out, inp, N, F);
    }
    void swiglu_backward(Ptr dinp, ConstPtr inp, ConstPtr dout, int N, int F) override {
        llama_.swiglu_backward(dinp, inp, dout, N, F);
    }

    // ---- linear ---------------------------------------------------------------------------------
    void matmul_forward(Ptr out, ConstPtr inp, ConstPtr weight, ConstPtr bias, int N, int channels,
                        int OC) override {
        linear_.matmul_forward(out, inp, weight, bias, N, channels, OC);
    }
    void matmul_backward(Ptr dinp, Ptr dweight, Ptr dbias, ConstPtr dout, ConstPtr inp,
                         ConstPtr weight, int N, int channels, int OC) override {
        linear_.matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, channels, OC);
    }
    void add_bias(Ptr out, ConstPtr bias, int N, int OC) override {
        linear_.add_bias(out, bias, N, OC);
    }
    // A mix of types the grouped product lacks (16-bit weights with fp32 gradients) goes
    // group by group through matmul_forward and matmul_backward (Ops' defaults).
    void grouped_matmul_forward(Ptr out, ConstPtr inp, const ConstPtr* weights,
                                const int32_t* offsets, int G, int channels, int OC) override {
        if (!grouped_.forward(out, inp, weights, offsets, G, channels, OC))
            Ops::grouped_matmul_forward(out, inp, weights, offsets, G, channels, OC);
    }
    void grouped_matmul_backward(Ptr dinp, const Ptr* dweights, ConstPtr dout, ConstPtr inp,
                                 const ConstPtr* weights, const int32_t* offsets, int G,
                                 int channels, int OC) override {
        const bool input =
            !dinp || grouped_.backward_input(dinp, dout, weights, offsets, G, channels, OC);
        const bool weight =
            !dweights || grouped_.backward_weight(dweights, dout, inp, offsets, G, channels, OC);
        if (!input || !weight)
            Ops::grouped_matmul_backward(input ? Ptr() : dinp, weight ? nullptr : dweights, dout,
                                         inp, weights, offsets, G, channels, OC);
    }

    // ---- attention --------------------------------------------------------------------------
    // Flash attention and cuDNN keep the fp32 log-sum-exp of each row (B,NH,T).
    AttentionSaved attention_saved(int B, int NH, int T, DType) const override {
        return {static_cast<std::size_t>(B) * NH * T, DType::f32};
    }
    void attention_forward(Ptr out, Ptr saved, ConstPtr qkv, int B, int T, int channels, int NH,
                           float drop_prob, uint64_t seed, int head_begin,
                           int heads_total) override {
        attention_.forward(out, saved.f32(), qkv, B, T, channels, NH, drop_prob, seed, head_begin,
                           heads_total, nullptr);
    }
    void attention_backward(Ptr dqkv, ConstPtr dout, ConstPtr qkv, ConstPtr out, ConstPtr saved,
                            int B, int T, int channels, int NH, float drop_prob, uint64_t seed,
                            int head_begin, int heads_total) override {
        attention_.backward(dqkv, dout, qkv, out, saved.f32(), B, T, channels, NH, drop_prob, seed,
                            head_begin, heads_total, nullptr);
    }
    void attention_rebuild(Ptr saved, ConstPtr qkv, int B, int T, int channels, int NH,
                           float drop_prob) override {
        attention_.rebuild(saved.f32(), qkv, B, T, channels, NH, drop_prob, nullptr);
    }
    // Within documents: the flash kernels with each row's document start (attention_ops.h).
    void document_attention_forward(Ptr out, Ptr saved, ConstPtr qkv, const int32_t* starts, int B,
                                    int T, int channels, int NH, float drop_prob, uint64_t seed,
                                    int head_begin, int heads_total) override {
        attention_.forward(out, saved.f32(), qkv, B, T, channels, NH, drop_prob, seed, head_begin,
                           heads_total, starts);
    }
    void document_attention_backward(Ptr dqkv, ConstPtr dout, ConstPtr qkv, ConstPtr out,
                                     ConstPtr saved, const int32_t* starts, int B, int T,
                                     int channels, int NH, float drop_prob, uint64_t seed,
                                     int head_begin, int heads_total) override {
        attention_.backward(dqkv, dout, qkv, out, saved.f32(), B, T, channels, NH, drop_prob, seed,
                            head_begin, heads_total, starts);
    }
    void document_attention_rebuild(Ptr saved, ConstPtr qkv, const int32_t* starts, int B, int T,
                                    int channels, int NH, float drop_prob) override {
        attention_.rebuild(saved.f32(), qkv, B, T, channels, NH, drop_prob, starts);
    }
    cuda::AttentionOps& attention() { return attention_; }

    // ---- attention against a key/value cache -------------------------------------------------
    void cached_attention_forward(Ptr out, Ptr k_cache, Ptr v_cache, ConstPtr qkv, int rows,
                                  int first, int NH, int KVH, int hs) override {
        if (!all_of_type(DType::f32, {out, k_cache, v_cache, qkv}))
            throw Error("cached_attention_forward runs in fp32");
        cuda::cached_attention_forward(out.f32(), k_cache.f32(), v_cache.f32(),
                                       static_cast<const float*>(qkv.data), rows, first, NH, KVH,
                                       hs, stream_);
    }

    // ---- ring attention ------------------------------------------------------------------
    void attention_block_forward(float* out, float* lse, ConstPtr qkv, ConstPtr kv,
                                 const AttentionBlock& k) override {
        if (all_of_type(qkv.dtype, {kv})) {
            dispatch(qkv.dtype, [&](auto e) {
                using E = decltype(e);
                cuda::attention_block_forward(out, lse, as<E>(qkv), as<E>(kv), k, stream_);
            });
            return;
        }
        auto v = views();
        const std::size_t q_elements = 3 * static_cast<std::size_t>(k.B) * k.q_rows * k.channels;
        const float* q = v.in(qkv, q_elements);
        cuda::attention_block_forward(
            out, lse, q, v.in(kv, 2 * static_cast<std::size_t>(k.B) * k.kv_rows * k.channels), k,
            stream_);
    }
    void attention_merge(float* out, float* lse, const float* block_out, const float* block_lse,
                         int B, int rows, int channels, int NH, int row_begin,
                         int row_count) override {
        cuda::attention_merge(out, lse, block_out, block_lse, B, rows, channels, NH, row_begin,
                              row_count, stream_);
    }
    void attention_block_backward(float* dq, float* dkv, ConstPtr dout, ConstPtr qkv, ConstPtr kv,
                                  ConstPtr out, const float* lse,
                                  const AttentionBlock& k) override {
        Scratch row_dot(allocator_,
                        static_cast<std::size_t>(k.B) * k.NH * k.q_rows * sizeof(float));
        if (all_of_type(qkv.dtype, {kv, dout, out})) {
            dispatch(qkv.dtype, [&](auto e) {
                using E = decltype(e);
                cuda::attention_block_backward(dq, dkv, row_dot.floats(), as<E>(dout), as<E>(qkv),
                                               as<E>(kv), as<E>(out), lse, k, stream_);
            });
            return;
        }
        auto v = views();
        const std::size_t rows_c = static_cast<std::size_t>(k.B) * k.q_rows * k.channels;
        const float* d = v.in(dout, rows_c);
        const float* q = v.in(qkv, 3 * rows_c);
        const float* kvs = v.in(kv, 2 * static_cast<std::size_t>(k.B) * k.kv_rows * k.channels);
        cuda::attention_block_backward(dq, dkv, row_dot.floats(), d, q, kvs, v.in(out, rows_c), lse,
                                       k, stream_);
    }

    // ---- pointwise ---------------------------------------------------------------------------
    void gelu_forward(Ptr out, ConstPtr inp, std::size_t count) override {
        if (all_of_type(out.dtype, {inp})) {
            dispatch(out.dtype, [&](auto e) {
                using E = decltype(e);
                cuda::gelu_forward(as<E>(out), as<E>(inp), count, stream_);
            });
            return;
        }
        auto v = views();
        cuda::gelu_forward(v.out(out, count), v.in(inp, count), count, stream_);
        v.commit();
    }
    void gelu_backward(Ptr dinp, ConstPtr inp, ConstPtr dout, std::size_t count) override {
        if (all_of_type(dinp.dtype, {inp, dout})) {
            dispatch(dinp.dtype, [&](auto e) {
                using E = decltype(e);
                cuda::gelu_backward(as<E>(dinp), as<E>(inp), as<E>(dout), count, stream_);
            });
            return;
        }
        auto v = views();
        cuda::gelu_backward(v.inout(dinp, count), v.in(inp, count), v.in(dout, count), count,
                            stream_);
        v.commit();
    }
    void residual_forward(Ptr out, ConstPtr a, ConstPtr b, std::size_t count) override {
        if (all_of_type(out.dtype, {a, b})) {
            dispatch(out.dtype, [&](auto e) {
                using E = decltype(e);
                cuda::residual_forward(as<E>(out), as<E>(a), as<E>(b), count, stream_);
            });
            return;
        }
        auto v = views();
        const float* x = v.in(a, count);
        const float* y = v.in(b, count);
        cuda::residual_forward(v.out(out, count), x, y, count, stream_);
        v.commit();
    }
    void relu_forward(Ptr out, ConstPtr inp, std::size_t count) override {
        if (all_of_type(out.dtype, {inp}))
            return dispatch(out.dtype, [&](auto e) {
                using E = decltype(e);
                cuda::relu_forward(as<E>(out), as<E>(inp), count, stream_);
            });
        auto v = views();
        cuda::relu_forward(v.out(out, count), v.in(inp, count), count, stream_);
        v.commit();
    }
    void multiply(Ptr out, ConstPtr a, ConstPtr b, std::size_t count, float factor) override {
        if (all_of_type(out.dtype, {a, b}))
            return dispatch(out.dtype, [&](auto e) {
                using E = decltype(e);
                cuda::multiply(as<E>(out), as<E>(a), as<E>(b), count, factor, stream_);
            });
        auto v = views();
        const float* x = v.in(a, count);
        const float* y = v.in(b, count);
        cuda::multiply(v.out(out, count), x, y, count, factor, stream_);
        v.commit();
    }
    void scale_rows(Ptr out, ConstPtr inp, const float* factors, std::size_t rows,
                    std::size_t cols) override {
        if (all_of_type(out.dtype, {inp}))
            return dispatch(out.dtype, [&](auto e) {
                using E = decltype(e);
                cuda::scale_rows(as<E>(out), as<E>(inp), factors, rows, cols, stream_);
            });
        auto v = views();
        const std::size_t count = rows * cols;
        const float* x = v.in(inp, count);
        cuda::scale_rows(v.out(out, count), x, factors, rows, cols, stream_);
        v.commit();
    }
    void dropout_forward(Ptr out, ConstPtr inp, std::size_t count, float drop_prob, uint64_t seed,
                         uint64_t index_begin) override {
        if (all_of_type(out.dtype, {inp})) {
            dispatch(out.dtype, [&](auto e) {
                using E = decltype(e);
                cuda::dropout_forward(as<E>(out), as<E>(inp), count, drop_prob, seed, index_begin,
                                      stream_);
            });
            return;
        }
        auto v = views();
        const float* x = v.in(inp, count);
        cuda::dropout_forward(v.out(out, count), x, count, drop_prob, seed, index_begin, stream_);
        v.commit();
    }
    void dropout_backward(Ptr dinp, ConstPtr dout, std::size_t count, float drop_prob,
                          uint64_t seed, uint64_t index_begin) override {
        if (all_of_type(dinp.dtype, {dout})) {
            dispatch(dinp.dtype, [&](auto e) {
                using E = decltype(e);
                cuda::dropout_backward(as<E>(dinp), as<E>(dout), count, drop_prob, seed,
                                       index_begin, stream_);
            });
            return;
        }
        auto v = views();
        cuda::dropout_backward(v.inout(dinp, count), v.in(dout, count), count, drop_prob, seed,
                               index_begin, stream_);
        v.commit();
    }

    // ---- loss -------------------------------------------------------------------------------
    void cross_entropy_partials(float* row_max, float* row_sumexp, float* target_logit,
                                ConstPtr logits, const int32_t* targets, int N, int vocab_begin,
                                int V, int Vp_local) override {
        dispatch(logits.dtype, [&](auto e) {
            using E = decltype(e);
            cuda::cross_entropy_partials(row_max, row_sumexp, target_logit, as<E>(logits), targets,
                                         N, vocab_begin, V, Vp_local, stream_);
        });
    }
    void cross_entropy_rescale(float* row_sumexp, const float* row_max, const float* global_max,
                               int N) override {
        cuda::cross_entropy_rescale(row_sumexp, row_max, global_max, N, stream_);
    }
    void add_mean(double* total, const float* losses, int N) override {
        cuda::add_mean(total, losses, N, stream_);
    }
    void cross_entropy_losses(float* losses, float* lse, const float* global_max,
                              const float* row_sumexp, const float* target_logit, int N) override {
        cuda::cross_entropy_losses(losses, lse, global_max, row_sumexp, target_logit, N, stream_);
    }
    void cross_entropy_backward(Ptr dlogits, ConstPtr logits, const float* lse,
                                const int32_t* targets, float dloss, int N, int vocab_begin, int V,
                                int Vp_local) override {
        if (all_of_type(dlogits.dtype, {logits})) {
            dispatch(dlogits.dtype, [&](auto e) {
                using E = decltype(e);
                cuda::cross_entropy_backward(as<E>(dlogits), as<E>(logits), lse, targets, dloss, N,
                                             vocab_begin, V, Vp_local, stream_);
            });
            return;
        }
        auto v = views();
        const std::size_t count = static_cast<std::size_t>(N) * Vp_local;
        const float* in = v.in(logits, count);
        cuda::cross_entropy_backward(v.out(dlogits, count), in, lse, targets, dloss, N, vocab_begin,
                                     V, Vp_local, stream_);
        v.commit();
    }

    // ---- a 4-bit frozen base -----------------------------------------------------------------
    void nf4_dequantize(Ptr out, const Nf4Matrix& m) override {
        cuda::nf4_dequantize(out, m, stream_);
    }

    // ---- optimizer --------------------------------------------------------------------------
    void add_sum_of_squares(double* total, ConstPtr x, std::size_t count) override {
        const Scratch scratch(allocator_, cuda::sum_of_squares_scratch() * sizeof(double));
        dispatch(x.dtype, [&](auto e) {
            using E = decltype(e);
            cuda::add_sum_of_squares(total, static_cast<double*>(scratch.data()), as<E>(x), count,
                                     stream_);
        });
    }
    void scale(Ptr x, std::size_t count, float factor) override {
        dispatch(x.dtype, [&](auto e) {
            using E = decltype(e);
            cuda::scale(as<E>(x), count, factor, stream_);
        });
    }
    void adamw_update(float* master, ConstPtr grads, float* m, float* v, std::size_t count,
                      float lr, float beta1, float beta2, float eps, float weight_decay, int step,
                      float grad_scale, Ptr params) override {
        dispatch(grads.dtype, [&](auto g) {
            using G = decltype(g);
            dispatch(params.dtype, [&](auto p) {
                using P = decltype(p);
                cuda::adamw_update(master, as<G>(grads), m, v, count, lr, beta1, beta2, eps,
                                   weight_decay, step, grad_scale, as<P>(params), stream_);
            });
        });
    }

    // ---- the whole-matrix optimizers -------------------------------------------------------
    void muon_momentum(float* u, float* momentum, ConstPtr grads, std::size_t count, float mu,
                       bool nesterov, float grad_scale) override {
        dispatch(grads.dtype, [&](auto g) {
            cuda::muon_momentum(u, momentum, as<decltype(g)>(grads), count, mu, nesterov,
                                grad_scale, stream_);
        });
    }
    void muon_update(float* master, const float* direction, std::size_t count, float lr,
                     float weight_decay, Ptr params) override {
        dispatch(params.dtype, [&](auto p) {
            cuda::matrix_update(master, direction, count, lr, weight_decay, false,
                                as<decltype(p)>(params), stream_);
        });
    }
    void galore_update(float* master, const float* direction, std::size_t count, float lr,
                       float weight_decay, Ptr params) override {
        dispatch(params.dtype, [&](auto p) {
            cuda::matrix_update(master, direction, count, lr, weight_decay, true,
                                as<decltype(p)>(params), stream_);
        });
    }
    void newton_schulz(float* x, float* scratch, int rows, int cols, int steps,
                       DType precision) override {
        newton_schulz_.run(x, scratch, rows, cols, steps, precision);
    }

private:
    cuda::Fp32Views views() { return cuda::Fp32Views(cuda::DeviceScratch(allocator_, stream_)); }

    cudaStream_t stream_;
    cuda::DeviceAllocator allocator_;  // first in, last out: the others release into it
    cuda::LinearOps linear_;
    cuda::AttentionOps attention_;
    cuda::LlamaOps llama_;
    cuda::UploadStaging uploads_;
    cuda::GroupedGemm grouped_;  // after uploads_: it stages through them
    cuda::NewtonSchulz newton_schulz_;
};

}  // namespace

std::unique_ptr<Ops> make_cuda_ops(bool tf32) {
    return std::make_unique<CudaOps>(tf32);
}

std::string prepare_attention(Ops& ops, const AttentionShape& shape) {
    auto* gpu = dynamic_cast<CudaOps*>(&ops);
    if (!gpu)
        throw Error("internal: prepare_attention on the " + std::string(ops.name()) + " backend");
    return gpu->attention().prepare(shape);
}

}  // namespace trident::kernels
