// CudaOps: the Ops interface (kernels/ops.h) on the GPU. Each op picks its kernel by the
// element types of its arguments: one type throughout (fp32, bf16 or fp16; parameter
// gradients may be fp32 besides) runs the templated kernels of cuda_kernels.h directly; any
// other mix goes through fp32 views (fp32_views.h). Linear layers are cuBLASLt products
// (gemm.h); attention is cuDNN's fused kernel where it is safe, else the built-in flash
// attention (attention.h), one choice per shape kept for the run (attention_path).
//
// Attention keeps no probabilities: what it saves for backward (attention_saved) is the
// per-row log-sum-exp (B,NH,T) in fp32, all that backward needs besides q, k, v and the
// forward's output.
#include "kernels/cuda/cuda_ops.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <initializer_list>
#include <map>
#include <string>
#include <tuple>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/fp32_views.h"
#include "kernels/cuda/gemm.h"
#include "kernels/error.h"
// The host's waits for the device are marked for the stall watchdog, since NCCL's collectives
// complete in them.
#include "kernels/host_wait.h"

namespace trident::kernels {
namespace {

// Calls f with a value of the C++ element type of `t`.
template <typename F>
void dispatch(DType t, F&& f) {
    switch (t) {
        case DType::f32:
            f(float{});
            return;
        case DType::bf16:
            f(__nv_bfloat16{});
            return;
        case DType::f16:
            f(__half{});
            return;
        default:
            throw Error(std::string("internal: a GPU op on ") + name_of(t) + " elements");
    }
}

// How a shape's attention is computed: the kernels (or none, when no kernel can) and, for
// the log, why not cuDNN.
enum class AttentionPath { cudnn, flash, none };
struct AttentionChoice {
    AttentionPath path;
    std::string why;  // why not cuDNN (empty when cuDNN runs it)
};

std::string describe(const AttentionShape& s) {
    char text[160];
    std::snprintf(text, sizeof(text), "B %d, T %d, %d heads of %d, %s, %s", s.B, s.T, s.NH,
                  s.NH > 0 ? s.C / s.NH : 0, name_of(s.type),
                  s.drop_prob > 0 ? "with attention dropout" : "without dropout");
    return text;
}

std::string describe(const AttentionShape& s, const AttentionChoice& c) {
    const std::string where = describe(s);
    switch (c.path) {
        case AttentionPath::cudnn:
            return "attention (" + where + "): cuDNN fused attention";
        case AttentionPath::flash:
            return "attention (" + where + "): the flash-attention kernels, as " + c.why;
        case AttentionPath::none:
            break;
    }
    return "attention (" + where + "): no kernel: the flash-attention kernels take heads of 1 to " +
           std::to_string(cuda::kFlashMaxHeadSize) + " elements and " + c.why;
}

template <typename E>
E* as(Ptr p) {
    return static_cast<E*>(p.data);
}
template <typename E>
const E* as(ConstPtr p) {
    return static_cast<const E*>(p.data);
}

// Whether every given (non-null) argument is of type t.
bool all_of_type(DType t, std::initializer_list<ConstPtr> arguments) {
    for (ConstPtr p : arguments)
        if (p.data != nullptr && p.dtype != t) return false;
    return true;
}

class CudaOps final : public Ops {
public:
    explicit CudaOps(bool tf32)
        : stream_(cuda::compute_stream()), gemm_(allocator_, tf32), cudnn_(allocator_) {}
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
    std::size_t allocated_bytes() const override { return allocator_.allocated_bytes(); }
    std::size_t peak_allocated_bytes() const override { return allocator_.peak_allocated_bytes(); }
    void reset_peak_allocated_bytes() override { allocator_.reset_peak(); }
    void upload(void* device, const void* host, std::size_t bytes) override {
        // Ops lets the caller reuse `host` on return. CUDA promises a copy has read pageable
        // memory at return only for synchronous copies (and never for pinned memory), so this
        // waits for it: a few uploads a step (the token ids), after the compute queued before.
        if (!bytes) return;
        TRIDENT_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream_));
        const HostWait wait;
        TRIDENT_CUDA_CHECK(cudaStreamSynchronize(stream_));
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
                           int C, int vocab_begin, int vocab_local, const int32_t* positions,
                           int wpe_rows) override {
        if (all_of_type(out.dtype, {wte, wpe})) {
            dispatch(out.dtype, [&](auto e) {
                using E = decltype(e);
                cuda::embedding_forward(as<E>(out), tokens, as<E>(wte), as<E>(wpe), B, T, C,
                                        vocab_begin, vocab_local, positions, stream_);
            });
            return;
        }
        auto v = views();
        const std::size_t NC = static_cast<std::size_t>(B) * T * C;
        cuda::embedding_forward(v.out(out, NC), tokens, v.in(wte, std::size_t(vocab_local) * C),
                                v.in(wpe, std::size_t(wpe_rows) * C), B, T, C, vocab_begin,
                                vocab_local, positions, stream_);
        v.commit();
    }
    void embedding_backward(Ptr dwte, Ptr dwpe, ConstPtr dout, const int32_t* tokens, int B, int T,
                            int C, int vocab_begin, int vocab_local, const int32_t* positions,
                            int) override {
        // The gradients may be of any type; the kernel converts as it adds.
        dispatch(dout.dtype, [&](auto e) {
            using E = decltype(e);
            cuda::embedding_backward(dwte, dwpe, as<E>(dout), tokens, B, T, C, vocab_begin,
                                     vocab_local, positions, stream_);
        });
    }

    // ---- layer norm ---------------------------------------------------------------------------
    void layernorm_forward(Ptr out, float* mean, float* rstd, ConstPtr inp, ConstPtr weight,
                           ConstPtr bias, int N, int C) override {
        if (all_of_type(inp.dtype, {out, weight, bias})) {
            dispatch(inp.dtype, [&](auto e) {
                using E = decltype(e);
                cuda::layernorm_forward(as<E>(out), mean, rstd, as<E>(inp), as<E>(weight),
                                        as<E>(bias), N, C, stream_);
            });
            return;
        }
        auto v = views();
        const std::size_t NC = static_cast<std::size_t>(N) * C;
        cuda::layernorm_forward(v.out(out, NC), mean, rstd, v.in(inp, NC), v.in(weight, C),
                                v.in(bias, C), N, C, stream_);
        v.commit();
    }
    void layernorm_backward(Ptr dinp, Ptr dweight, Ptr dbias, ConstPtr dout, ConstPtr inp,
                            ConstPtr weight, const float* mean, const float* rstd, int N,
                            int C) override {
        Scratch scratch(allocator_, cuda::layernorm_backward_scratch(N, C) * sizeof(float));
        if (all_of_type(inp.dtype, {dinp, dout, weight})) {
            dispatch(inp.dtype, [&](auto e) {
                using E = decltype(e);
                cuda::layernorm_backward(as<E>(dinp), dweight, dbias, scratch.floats(), as<E>(dout),
                                         as<E>(inp), as<E>(weight), mean, rstd, N, C, stream_);
            });
            return;
        }
        auto v = views();
        const std::size_t NC = static_cast<std::size_t>(N) * C;
        cuda::layernorm_backward(v.inout(dinp, NC), v.inout(dweight, C), v.inout(dbias, C),
                                 scratch.floats(), v.in(dout, NC), v.in(inp, NC), v.in(weight, C),
                                 mean, rstd, N, C, stream_);
        v.commit();
    }

    // ---- linear ---------------------------------------------------------------------------------
    void matmul_forward(Ptr out, ConstPtr inp, ConstPtr weight, ConstPtr bias, int N, int C,
                        int OC) override {
        // out (N,OC) = inp (N,C) @ weight^T, weight stored (OC,C), plus the bias in the epilogue.
        if (inp.dtype == weight.dtype && cuda::Gemm::supports(inp.dtype, out.dtype) &&
            all_of_type(out.dtype, {bias})) {
            product(out, inp, false, weight, true, N, OC, C, 0.0f, bias);
            return;
        }
        auto v = views();
        product(v.out(out, std::size_t(N) * OC), v.in(inp, std::size_t(N) * C), false,
                v.in(weight, std::size_t(OC) * C), true, N, OC, C, 0.0f, v.in(bias, OC));
        v.commit();
    }
    void matmul_backward(Ptr dinp, Ptr dweight, Ptr dbias, ConstPtr dout, ConstPtr inp,
                         ConstPtr weight, int N, int C, int OC) override {
        const DType ab = dout.dtype;
        const bool direct = inp.dtype == dout.dtype && weight.dtype == dout.dtype &&
                            (!dweight || cuda::Gemm::supports(ab, dweight.dtype)) &&
                            (!dinp || cuda::Gemm::supports(ab, dinp.dtype));
        auto v = views();
        const Ptr dinp_ = direct ? dinp : Ptr(v.inout(dinp, std::size_t(N) * C));
        const Ptr dweight_ = direct ? dweight : Ptr(v.inout(dweight, std::size_t(OC) * C));
        const ConstPtr dout_ = direct ? dout : ConstPtr(v.in(dout, std::size_t(N) * OC));
        const ConstPtr inp_ = direct ? inp : ConstPtr(v.in(inp, std::size_t(N) * C));
        const ConstPtr weight_ = direct ? weight : ConstPtr(v.in(weight, std::size_t(OC) * C));
        // dinp (N,C) += dout (N,OC) @ weight (OC,C); dweight (OC,C) += dout^T @ inp (N,C).
        if (dinp_) product(dinp_, dout_, false, weight_, false, N, C, OC, 1.0f, ConstPtr());
        if (dweight_) product(dweight_, dout_, true, inp_, false, OC, C, N, 1.0f, ConstPtr());
        if (dbias) {
            Scratch scratch(allocator_, cuda::bias_grad_scratch(N, OC) * sizeof(float));
            dispatch(dout.dtype, [&](auto e) {
                using E = decltype(e);
                cuda::bias_grad(dbias, scratch.floats(), as<E>(dout), N, OC, stream_);
            });
        }
        v.commit();
    }
    void add_bias(Ptr out, ConstPtr bias, int N, int OC) override {
        if (all_of_type(out.dtype, {bias})) {
            dispatch(out.dtype, [&](auto e) {
                using E = decltype(e);
                cuda::add_bias(as<E>(out), as<E>(bias), N, OC, stream_);
            });
            return;
        }
        auto v = views();
        cuda::add_bias(v.inout(out, std::size_t(N) * OC), v.in(bias, OC), N, OC, stream_);
        v.commit();
    }

    // ---- attention
    // -------------------------------------------------------------------------------
    // Flash attention and cuDNN keep the fp32 log-sum-exp of each row (B,NH,T).
    AttentionSaved attention_saved(int B, int NH, int T, DType) const override {
        return {static_cast<std::size_t>(B) * NH * T, DType::f32};
    }
    void attention_forward(Ptr out, Ptr saved, ConstPtr qkv, int B, int T, int C, int NH,
                           float drop_prob, uint64_t seed, int head_begin,
                           int heads_total) override {
        float* lse = saved.f32();
        const std::size_t BTC = static_cast<std::size_t>(B) * T * C;
        if (attention_path({B, T, C, NH, qkv.dtype, drop_prob}) == AttentionPath::cudnn) {
            if (out.dtype == qkv.dtype) {
                cudnn_.forward(out, lse, qkv, B, T, C, NH, stream_);
                return;
            }
            // cuDNN writes qkv's type; the output is rounded into out's from there.
            Scratch o(allocator_, BTC * size_of(qkv.dtype));
            cudnn_.forward(Ptr(o.data, qkv.dtype), lse, qkv, B, T, C, NH, stream_);
            convert(out, Ptr(o.data, qkv.dtype), BTC);
            return;
        }
        if (out.dtype != qkv.dtype) {
            auto v = views();
            cuda::flash_attention_forward(v.out(out, BTC), lse, v.in(qkv, 3 * BTC), B, T, C, NH,
                                          drop_prob, seed, head_begin, heads_total, stream_);
            v.commit();
            return;
        }
        dispatch(qkv.dtype, [&](auto e) {
            using E = decltype(e);
            cuda::flash_attention_forward(as<E>(out), lse, as<E>(qkv), B, T, C, NH, drop_prob, seed,
                                          head_begin, heads_total, stream_);
        });
    }
    // The forward's kernels where the types allow; with mixed types the flash kernels, whose
    // backward takes cuDNN's statistics as well (attention.h).
    void attention_backward(Ptr dqkv, ConstPtr dout, ConstPtr qkv, ConstPtr out, ConstPtr saved,
                            int B, int T, int C, int NH, float drop_prob, uint64_t seed,
                            int head_begin, int heads_total) override {
        const float* lse = saved.f32();
        const std::size_t BTC = static_cast<std::size_t>(B) * T * C;
        const bool one_type = all_of_type(qkv.dtype, {dqkv, dout, out});
        if (one_type &&
            attention_path({B, T, C, NH, qkv.dtype, drop_prob}) == AttentionPath::cudnn) {
            // cuDNN overwrites its gradient: into scratch, then added (ops.h's +=).
            Scratch grad(allocator_, 3 * BTC * size_of(qkv.dtype));
            cudnn_.backward(Ptr(grad.data, qkv.dtype), dout, qkv, out, lse, B, T, C, NH, stream_);
            residual_forward(dqkv, dqkv, Ptr(grad.data, qkv.dtype), 3 * BTC);
            return;
        }
        Scratch row_dot(allocator_, static_cast<std::size_t>(B) * NH * T * sizeof(float));
        if (!one_type) {
            auto v = views();
            cuda::flash_attention_backward(v.inout(dqkv, 3 * BTC), row_dot.floats(),
                                           v.in(dout, BTC), v.in(qkv, 3 * BTC), v.in(out, BTC), lse,
                                           B, T, C, NH, drop_prob, seed, head_begin, heads_total,
                                           stream_);
            v.commit();
            return;
        }
        dispatch(qkv.dtype, [&](auto e) {
            using E = decltype(e);
            cuda::flash_attention_backward(as<E>(dqkv), row_dot.floats(), as<E>(dout), as<E>(qkv),
                                           as<E>(out), lse, B, T, C, NH, drop_prob, seed,
                                           head_begin, heads_total, stream_);
        });
    }
    // The statistics again, by the kernels of the forward (the same shape and drop_prob give
    // the same path): cuDNN's has no statistics-only form, so its output goes to scratch. The
    // flash kernels' statistics do not depend on the element type they read (all arithmetic is
    // fp32 on exactly widened values), so a forward through fp32 views rebuilds alike.
    void attention_rebuild(Ptr saved, ConstPtr qkv, int B, int T, int C, int NH,
                           float drop_prob) override {
        float* lse = saved.f32();
        if (attention_path({B, T, C, NH, qkv.dtype, drop_prob}) == AttentionPath::cudnn) {
            Scratch out(allocator_, static_cast<std::size_t>(B) * T * C * size_of(qkv.dtype));
            cudnn_.forward(Ptr(out.data, qkv.dtype), lse, qkv, B, T, C, NH, stream_);
            return;
        }
        dispatch(qkv.dtype, [&](auto e) {
            using E = decltype(e);
            cuda::flash_attention_forward(static_cast<E*>(nullptr), lse, as<E>(qkv), B, T, C, NH,
                                          0.0f, 0, 0, NH, stream_);
        });
    }

    // The kernels for a shape, chosen on its first use (or by prepare_attention) and kept, so
    // that a rebuild runs the forward's kernels; said on stderr when first chosen here.
    AttentionPath attention_path(const AttentionShape& shape) {
        const AttentionChoice& choice = choose_attention(shape, true);
        if (choice.path == AttentionPath::none) throw Error(describe(shape, choice));
        return choice.path;
    }

    // Chooses (once) the kernels of a shape: cuDNN without dropout where it is safe and
    // builds, else the flash kernels where the head size allows, else none.
    const AttentionChoice& choose_attention(const AttentionShape& shape, bool announce) {
        const auto key = std::make_tuple(static_cast<int>(shape.type), shape.drop_prob > 0.0f,
                                         shape.B, shape.T, shape.C, shape.NH);
        const auto known = attention_paths_.find(key);
        if (known != attention_paths_.end()) return known->second;
        AttentionChoice choice{AttentionPath::cudnn, ""};
        if (shape.drop_prob > 0.0f)
            choice = {AttentionPath::flash, "cuDNN's dropout mask is not the model's"};
        else if (!cudnn_.supports(shape.type, shape.B, shape.T, shape.C, shape.NH, &choice.why))
            choice.path = AttentionPath::flash;
        if (choice.path == AttentionPath::flash &&
            !cuda::flash_attention_supports(shape.C / shape.NH))
            choice.path = AttentionPath::none;
        const AttentionChoice& kept = attention_paths_.emplace(key, choice).first->second;
        if (announce && kept.path != AttentionPath::none)
            std::fprintf(stderr, "trident: %s\n", describe(shape, kept).c_str());
        return kept;
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
        const std::size_t q_elements = 3 * static_cast<std::size_t>(k.B) * k.q_rows * k.C;
        const float* q = v.in(qkv, q_elements);
        cuda::attention_block_forward(
            out, lse, q, v.in(kv, 2 * static_cast<std::size_t>(k.B) * k.kv_rows * k.C), k, stream_);
    }
    void attention_merge(float* out, float* lse, const float* block_out, const float* block_lse,
                         int B, int rows, int C, int NH, int row_begin, int row_count) override {
        cuda::attention_merge(out, lse, block_out, block_lse, B, rows, C, NH, row_begin, row_count,
                              stream_);
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
        const std::size_t rows_c = static_cast<std::size_t>(k.B) * k.q_rows * k.C;
        const float* d = v.in(dout, rows_c);
        const float* q = v.in(qkv, 3 * rows_c);
        const float* kvs = v.in(kv, 2 * static_cast<std::size_t>(k.B) * k.kv_rows * k.C);
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

    // ---- loss
    // --------------------------------------------------------------------------------------
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

    // ---- optimizer
    // ---------------------------------------------------------------------------------
    void add_sum_of_squares(double* total, ConstPtr x, std::size_t count) override {
        Scratch scratch(allocator_, cuda::sum_of_squares_scratch() * sizeof(double));
        dispatch(x.dtype, [&](auto e) {
            using E = decltype(e);
            cuda::add_sum_of_squares(total, static_cast<double*>(scratch.data), as<E>(x), count,
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

private:
    // Device scratch for one op, back to the cache when the op is queued.
    struct Scratch {
        cuda::DeviceAllocator& allocator;
        void* data;
        Scratch(cuda::DeviceAllocator& a, std::size_t bytes)
            : allocator(a), data(a.allocate(bytes)) {}
        ~Scratch() { allocator.release(data); }
        Scratch(const Scratch&) = delete;
        Scratch& operator=(const Scratch&) = delete;
        float* floats() const { return static_cast<float*>(data); }
    };

    // out (rows, cols) = a' @ b' + beta * out (+ bias): a' is a or a^T (trans_a), b' likewise.
    void product(Ptr out, ConstPtr a, bool trans_a, ConstPtr b, bool trans_b, int rows, int cols,
                 int inner, float beta, ConstPtr bias) {
        cuda::GemmCall call;
        call.rows = rows;
        call.cols = cols;
        call.inner = inner;
        call.a = a;
        call.trans_a = trans_a;
        call.b = b;
        call.trans_b = trans_b;
        call.d = out;
        call.beta = beta;
        if (bias) {
            call.epilogue = cuda::Epilogue::bias;
            call.bias = bias;
        }
        gemm_.run(call, stream_);
    }

    cuda::Fp32Views views() { return cuda::Fp32Views(cuda::DeviceScratch(allocator_, stream_)); }

    cudaStream_t stream_;
    cuda::DeviceAllocator allocator_;  // first in, last out: the others release into it
    cuda::Gemm gemm_;
    cuda::CudnnAttention cudnn_;
    // Chosen attention kernels by (type, dropout or not, B, T, C, NH).
    std::map<std::tuple<int, bool, int, int, int, int>, AttentionChoice> attention_paths_;
};

}  // namespace

std::unique_ptr<Ops> make_cuda_ops(bool tf32) {
    return std::make_unique<CudaOps>(tf32);
}

std::string prepare_attention(Ops& ops, const AttentionShape& shape) {
    auto* gpu = dynamic_cast<CudaOps*>(&ops);
    if (!gpu)
        throw Error("internal: prepare_attention on the " + std::string(ops.name()) + " backend");
    std::string said;
    // Training draws the dropout mask; evaluation and generation run the same shape without.
    for (const float drop_prob : {shape.drop_prob, 0.0f}) {
        AttentionShape s = shape;
        s.drop_prob = drop_prob;
        const AttentionChoice& choice = gpu->choose_attention(s, false);
        if (choice.path == AttentionPath::none) throw Error(describe(s, choice));
        said += describe(s, choice) + "\n";
        if (drop_prob == 0.0f) break;
    }
    return said;
}

}  // namespace trident::kernels
