// The CPU backend: CpuOps implements the Ops interface on host memory, owning the memory
// functions itself and forwarding every op to the kernels in this folder (cpu_kernels.h).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/fp32_views.h"
#include "kernels/error.h"
#include "kernels/ops.h"
#include "kernels/source_path.h"
#include "kernels/threads.h"

namespace trident::kernels {
namespace {

// 64 bytes: a cache line, and the width of an AVX-512 register.
constexpr std::size_t kAlignment = 64;

class CpuOps final : public Ops {
public:
    ~CpuOps() override {
        if (workspace_) release(workspace_.data);
    }
    const char* name() const override { return "cpu"; }

    Ptr allocate(std::size_t count, DType dtype) override {
        // aligned_alloc wants a size that is a multiple of the alignment (and not 0).
        const std::size_t bytes = std::max<std::size_t>(
            kAlignment, (count * size_of(dtype) + kAlignment - 1) / kAlignment * kAlignment);
        void* buffer = std::aligned_alloc(kAlignment, bytes);
        if (buffer == nullptr) {
            throw Error(std::string(source_path(__FILE__)) + ":" + std::to_string(__LINE__) +
                        ": out of host memory allocating " + std::to_string(bytes) +
                        " bytes; try a smaller batch or model");
        }
        std::memset(buffer, 0, bytes);
        sizes_[buffer] = bytes;
        allocated_ += bytes;
        peak_ = std::max(peak_, allocated_);
        return Ptr(buffer, dtype);
    }
    void release(void* buffer) override {
        const auto it = sizes_.find(buffer);
        allocated_ -= it->second;
        sizes_.erase(it);
        std::free(buffer);
    }
    void* allocate_host(std::size_t bytes) override {
        void* buffer = std::calloc(std::max<std::size_t>(1, bytes), 1);
        if (buffer == nullptr)
            throw Error("out of host memory allocating " + std::to_string(bytes) + " bytes");
        return buffer;
    }
    void release_host(void* buffer) override { std::free(buffer); }
    std::size_t allocated_bytes() const override { return allocated_; }
    std::size_t peak_allocated_bytes() const override { return peak_; }
    void reset_peak_allocated_bytes() override { peak_ = allocated_; }
    void upload(void* device, const void* host, std::size_t bytes) override {
        if (bytes > 0 && device != host) std::memcpy(device, host, bytes);
    }
    void download(void* host, const void* device, std::size_t bytes) override {
        if (bytes > 0 && device != host) std::memcpy(host, device, bytes);
    }
    void zero(Ptr x, std::size_t count) override {
        if (count > 0) std::memset(x.data, 0, count * size_of(x.dtype));  // +0 in every type
    }
    void copy(Ptr out, ConstPtr in, std::size_t count) override {
        if (out.dtype != in.dtype)
            throw Error(std::string("internal: copy from ") + name_of(in.dtype) + " to " +
                        name_of(out.dtype) + "; convert changes types");
        if (count > 0 && out.data != in.data)
            std::memcpy(out.data, in.data, count * size_of(out.dtype));
    }
    void convert(Ptr out, ConstPtr in, std::size_t count) override {
        cpu::Fp32Views v(scratch_);
        const float* from = v.in(in, count);
        float* to = v.out(out, count);
        if (count > 0 && to != from) std::memcpy(to, from, count * sizeof(float));
        v.commit();
    }

    void copy_2d(Ptr out, std::size_t out_stride, ConstPtr in, std::size_t in_stride,
                 std::size_t rows, std::size_t cols) override {
        const std::size_t width = size_of(out.dtype);
        for (std::size_t r = 0; r < rows; ++r) {
            const Ptr to = out + r * out_stride;
            const ConstPtr from = in + r * in_stride;
            if (out.dtype == in.dtype) {
                if (cols > 0) std::memcpy(to.data, from.data, cols * width);
                continue;
            }
            row_.resize(cols);
            widen(row_.data(), from, cols);
            narrow(to, row_.data(), cols);
        }
    }

    void embedding_forward(Ptr out, const int32_t* tokens, ConstPtr wte, ConstPtr wpe, int B, int T,
                           int channels, int vocab_begin, int vocab_local, const int32_t* positions,
                           int wpe_rows) override {
        cpu::Fp32Views v(scratch_);
        const std::size_t NC = static_cast<std::size_t>(B) * T * channels;
        cpu::embedding_forward(v.out(out, NC), tokens,
                               v.in(wte, std::size_t(vocab_local) * channels),
                               v.in(wpe, std::size_t(wpe_rows) * channels), B, T, channels,
                               vocab_begin, vocab_local, positions);
        v.commit();
    }
    void embedding_backward(Ptr dwte, Ptr dwpe, ConstPtr dout, const int32_t* tokens, int B, int T,
                            int channels, int vocab_begin, int vocab_local,
                            const int32_t* positions, int wpe_rows) override {
        cpu::Fp32Views v(scratch_);
        const std::size_t NC = static_cast<std::size_t>(B) * T * channels;
        cpu::embedding_backward(v.inout(dwte, std::size_t(vocab_local) * channels),
                                v.inout(dwpe, std::size_t(wpe_rows) * channels), v.in(dout, NC),
                                tokens, B, T, channels, vocab_begin, vocab_local, positions);
        v.commit();
    }

    void layernorm_forward(Ptr out, float* mean, float* rstd, ConstPtr inp, ConstPtr weight,
                           ConstPtr bias, int N, int channels) override {
        cpu::Fp32Views v(scratch_);
        const std::size_t NC = static_cast<std::size_t>(N) * channels;
        cpu::layernorm_forward(v.out(out, NC), mean, rstd, v.in(inp, NC), v.in(weight, channels),
                               v.in(bias, channels), N, channels);
        v.commit();
    }
    void layernorm_backward(Ptr dinp, Ptr dweight, Ptr dbias, ConstPtr dout, ConstPtr inp,
                            ConstPtr weight, const float* mean, const float* rstd, int N,
                            int channels) override {
        cpu::Fp32Views v(scratch_);
        const std::size_t NC = static_cast<std::size_t>(N) * channels;
        cpu::layernorm_backward(v.inout(dinp, NC), v.inout(dweight, channels),
                                v.inout(dbias, channels), v.in(dout, NC), v.in(inp, NC),
                                v.in(weight, channels), mean, rstd, N, channels);
        v.commit();
    }

    void rmsnorm_forward(Ptr out, float* rstd, ConstPtr inp, ConstPtr weight, int N, int channels,
                         float eps) override {
        cpu::Fp32Views v(scratch_);
        const std::size_t NC = static_cast<std::size_t>(N) * channels;
        cpu::rmsnorm_forward(v.out(out, NC), rstd, v.in(inp, NC), v.in(weight, channels), N,
                             channels, eps);
        v.commit();
    }
    void rmsnorm_backward(Ptr dinp, Ptr dweight, ConstPtr dout, ConstPtr inp, ConstPtr weight,
                          const float* rstd, int N, int channels) override {
        cpu::Fp32Views v(scratch_);
        const std::size_t NC = static_cast<std::size_t>(N) * channels;
        cpu::rmsnorm_backward(v.inout(dinp, NC), v.inout(dweight, channels), v.in(dout, NC),
                              v.in(inp, NC), v.in(weight, channels), rstd, N, channels);
        v.commit();
    }
    void rotary_qkv_forward(Ptr out, ConstPtr qkv, int B, int T, int NH, int KVH, int hs,
                            float theta, const int32_t* positions) override {
        cpu::Fp32Views v(scratch_);
        const std::size_t rows = static_cast<std::size_t>(B) * T;
        cpu::rotary_qkv_forward(v.out(out, rows * 3 * NH * hs),
                                v.in(qkv, rows * (NH + 2 * KVH) * hs), B, T, NH, KVH, hs, theta,
                                positions);
        v.commit();
    }
    void rotary_qkv_backward(Ptr dqkv, ConstPtr dout, int B, int T, int NH, int KVH, int hs,
                             float theta, const int32_t* positions) override {
        cpu::Fp32Views v(scratch_);
        const std::size_t rows = static_cast<std::size_t>(B) * T;
        cpu::rotary_qkv_backward(v.inout(dqkv, rows * (NH + 2 * KVH) * hs),
                                 v.in(dout, rows * 3 * NH * hs), B, T, NH, KVH, hs, theta,
                                 positions);
        v.commit();
    }
    void cached_attention_forward(Ptr out, Ptr k_cache, Ptr v_cache, ConstPtr qkv, int rows,
                                  int first, int NH, int KVH, int hs) override {
        cpu::Fp32Views v(scratch_);
        const std::size_t cache = static_cast<std::size_t>(first + rows) * KVH * hs;
        const std::size_t channels = static_cast<std::size_t>(NH) * hs;
        cpu::cached_attention_forward(v.out(out, rows * channels), v.inout(k_cache, cache),
                                      v.inout(v_cache, cache), v.in(qkv, rows * 3 * channels), rows,
                                      first, NH, KVH, hs);
        v.commit();
    }
    void swiglu_forward(Ptr out, ConstPtr inp, int N, int F) override {
        cpu::Fp32Views v(scratch_);
        const std::size_t NF = static_cast<std::size_t>(N) * F;
        cpu::swiglu_forward(v.out(out, NF), v.in(inp, 2 * NF), N, F);
        v.commit();
    }
    void swiglu_backward(Ptr dinp, ConstPtr inp, ConstPtr dout, int N, int F) override {
        cpu::Fp32Views v(scratch_);
        const std::size_t NF = static_cast<std::size_t>(N) * F;
        cpu::swiglu_backward(v.inout(dinp, 2 * NF), v.in(inp, 2 * NF), v.in(dout, NF), N, F);
        v.commit();
    }

    void matmul_forward(Ptr out, ConstPtr inp, ConstPtr weight, ConstPtr bias, int N, int channels,
                        int OC) override {
        cpu::Fp32Views v(scratch_);
        cpu::matmul_forward(v.out(out, std::size_t(N) * OC), v.in(inp, std::size_t(N) * channels),
                            v.in(weight, std::size_t(OC) * channels), v.in(bias, OC), N, channels,
                            OC);
        v.commit();
    }
    void matmul_backward(Ptr dinp, Ptr dweight, Ptr dbias, ConstPtr dout, ConstPtr inp,
                         ConstPtr weight, int N, int channels, int OC) override {
        cpu::Fp32Views v(scratch_);
        cpu::matmul_backward(v.inout(dinp, std::size_t(N) * channels),
                             v.inout(dweight, std::size_t(OC) * channels), v.inout(dbias, OC),
                             v.in(dout, std::size_t(N) * OC), v.in(inp, std::size_t(N) * channels),
                             v.in(weight, std::size_t(OC) * channels), N, channels, OC);
        v.commit();
    }
    // grouped_matmul_forward and _backward: the defaults, one matmul per group (ops.cpp).
    void add_bias(Ptr out, ConstPtr bias, int N, int OC) override {
        cpu::Fp32Views v(scratch_);
        cpu::add_bias(v.inout(out, std::size_t(N) * OC), v.in(bias, OC), N, OC);
        v.commit();
    }

    AttentionSaved attention_saved(int B, int NH, int T, DType activations) const override {
        return cpu_attention_saved(B, NH, T, activations);
    }
    void attention_forward(Ptr out, Ptr saved, ConstPtr qkv, int B, int T, int channels, int NH,
                           float drop_prob, uint64_t seed, int head_begin,
                           int heads_total) override {
        document_attention_forward(out, saved, qkv, nullptr, B, T, channels, NH, drop_prob, seed,
                                   head_begin, heads_total);
    }
    void attention_backward(Ptr dqkv, ConstPtr dout, ConstPtr qkv, ConstPtr out, ConstPtr saved,
                            int B, int T, int channels, int NH, float drop_prob, uint64_t seed,
                            int head_begin, int heads_total) override {
        document_attention_backward(dqkv, dout, qkv, out, saved, nullptr, B, T, channels, NH,
                                    drop_prob, seed, head_begin, heads_total);
    }
    void attention_rebuild(Ptr saved, ConstPtr qkv, int B, int T, int channels, int NH,
                           float drop_prob) override {
        document_attention_rebuild(saved, qkv, nullptr, B, T, channels, NH, drop_prob);
    }
    // The causal attention above is the one of a single document (null starts).
    void document_attention_forward(Ptr out, Ptr saved, ConstPtr qkv, const int32_t* starts, int B,
                                    int T, int channels, int NH, float drop_prob, uint64_t seed,
                                    int head_begin, int heads_total) override {
        cpu::Fp32Views v(scratch_);
        const std::size_t BTC = static_cast<std::size_t>(B) * T * channels;
        cpu::attention_forward(v.out(out, BTC), v.out(saved, probs_size(B, NH, T)),
                               v.in(qkv, 3 * BTC), B, T, channels, NH, drop_prob, seed, head_begin,
                               heads_total, starts);
        v.commit();
    }
    void document_attention_backward(Ptr dqkv, ConstPtr dout, ConstPtr qkv, ConstPtr,
                                     ConstPtr saved, const int32_t* starts, int B, int T,
                                     int channels, int NH, float drop_prob, uint64_t seed,
                                     int head_begin, int heads_total) override {
        const std::size_t probs = probs_size(B, NH, T);
        // The gradient of the probabilities, a (B,NH,T,T) workspace of dqkv's type, kept and
        // grown as needed: it counts in the allocator's figures as the model's buffers do.
        if (workspace_count_ < probs || workspace_.dtype != dqkv.dtype) {
            if (workspace_) release(workspace_.data);
            workspace_ = allocate(probs, dqkv.dtype);
            workspace_count_ = probs;
        }
        cpu::Fp32Views v(scratch_);
        const std::size_t BTC = static_cast<std::size_t>(B) * T * channels;
        cpu::attention_backward(v.inout(dqkv, 3 * BTC), v.out(workspace_, probs), v.in(dout, BTC),
                                v.in(qkv, 3 * BTC), v.in(saved, probs), B, T, channels, NH,
                                drop_prob, seed, head_begin, heads_total, starts);
        v.commit();
    }
    // The probabilities come before dropout, whatever drop_prob is.
    void document_attention_rebuild(Ptr saved, ConstPtr qkv, const int32_t* starts, int B, int T,
                                    int channels, int NH, float) override {
        cpu::Fp32Views v(scratch_);
        cpu::attention_probs(v.out(saved, probs_size(B, NH, T)),
                             v.in(qkv, 3 * static_cast<std::size_t>(B) * T * channels), B, T,
                             channels, NH, starts);
        v.commit();
    }

    void attention_block_forward(float* out, float* lse, ConstPtr qkv, ConstPtr kv,
                                 const AttentionBlock& k) override {
        cpu::Fp32Views v(scratch_);
        const float* q = v.in(qkv, 3 * static_cast<std::size_t>(k.B) * k.q_rows * k.channels);
        cpu::attention_block_forward(
            out, lse, q, v.in(kv, 2 * static_cast<std::size_t>(k.B) * k.kv_rows * k.channels), k);
    }
    void attention_merge(float* out, float* lse, const float* block_out, const float* block_lse,
                         int B, int rows, int channels, int NH, int row_begin,
                         int row_count) override {
        cpu::attention_merge(out, lse, block_out, block_lse, B, rows, channels, NH, row_begin,
                             row_count);
    }
    void attention_block_backward(float* dq, float* dkv, ConstPtr dout, ConstPtr qkv, ConstPtr kv,
                                  ConstPtr out, const float* lse,
                                  const AttentionBlock& k) override {
        cpu::Fp32Views v(scratch_);
        const std::size_t rows_c = static_cast<std::size_t>(k.B) * k.q_rows * k.channels;
        const float* d = v.in(dout, rows_c);
        const float* q = v.in(qkv, 3 * rows_c);
        const float* kvs = v.in(kv, 2 * static_cast<std::size_t>(k.B) * k.kv_rows * k.channels);
        cpu::attention_block_backward(dq, dkv, d, q, kvs, v.in(out, rows_c), lse, k);
    }

    void gelu_forward(Ptr out, ConstPtr inp, std::size_t count) override {
        cpu::Fp32Views v(scratch_);
        cpu::gelu_forward(v.out(out, count), v.in(inp, count), count);
        v.commit();
    }
    void gelu_backward(Ptr dinp, ConstPtr inp, ConstPtr dout, std::size_t count) override {
        cpu::Fp32Views v(scratch_);
        cpu::gelu_backward(v.inout(dinp, count), v.in(inp, count), v.in(dout, count), count);
        v.commit();
    }
    void residual_forward(Ptr out, ConstPtr a, ConstPtr b, std::size_t count) override {
        cpu::Fp32Views v(scratch_);
        cpu::residual_forward(v.out(out, count), v.in(a, count), v.in(b, count), count);
        v.commit();
    }
    void relu_forward(Ptr out, ConstPtr inp, std::size_t count) override {
        cpu::Fp32Views v(scratch_);
        cpu::relu_forward(v.out(out, count), v.in(inp, count), count);
        v.commit();
    }
    void multiply(Ptr out, ConstPtr a, ConstPtr b, std::size_t count, float factor) override {
        cpu::Fp32Views v(scratch_);
        cpu::multiply(v.out(out, count), v.in(a, count), v.in(b, count), count, factor);
        v.commit();
    }
    void scale_rows(Ptr out, ConstPtr inp, const float* factors, std::size_t rows,
                    std::size_t cols) override {
        cpu::Fp32Views v(scratch_);
        const std::size_t count = rows * cols;
        cpu::scale_rows(v.out(out, count), v.in(inp, count), factors, rows, cols);
        v.commit();
    }
    void dropout_forward(Ptr out, ConstPtr inp, std::size_t count, float drop_prob, uint64_t seed,
                         uint64_t index_begin) override {
        cpu::Fp32Views v(scratch_);
        cpu::dropout_forward(v.out(out, count), v.in(inp, count), count, drop_prob, seed,
                             index_begin);
        v.commit();
    }
    void dropout_backward(Ptr dinp, ConstPtr dout, std::size_t count, float drop_prob,
                          uint64_t seed, uint64_t index_begin) override {
        cpu::Fp32Views v(scratch_);
        cpu::dropout_backward(v.inout(dinp, count), v.in(dout, count), count, drop_prob, seed,
                              index_begin);
        v.commit();
    }

    void cross_entropy_partials(float* row_max, float* row_sumexp, float* target_logit,
                                ConstPtr logits, const int32_t* targets, int N, int vocab_begin,
                                int V, int Vp_local) override {
        cpu::Fp32Views v(scratch_);
        cpu::cross_entropy_partials(row_max, row_sumexp, target_logit,
                                    v.in(logits, std::size_t(N) * Vp_local), targets, N,
                                    vocab_begin, V, Vp_local);
        v.commit();
    }
    void cross_entropy_rescale(float* row_sumexp, const float* row_max, const float* global_max,
                               int N) override {
        cpu::cross_entropy_rescale(row_sumexp, row_max, global_max, N);
    }
    void cross_entropy_losses(float* losses, float* lse, const float* global_max,
                              const float* row_sumexp, const float* target_logit, int N) override {
        cpu::cross_entropy_losses(losses, lse, global_max, row_sumexp, target_logit, N);
    }
    void cross_entropy_backward(Ptr dlogits, ConstPtr logits, const float* lse,
                                const int32_t* targets, float dloss, int N, int vocab_begin, int V,
                                int Vp_local) override {
        cpu::Fp32Views v(scratch_);
        const std::size_t count = static_cast<std::size_t>(N) * Vp_local;
        const float* in = v.in(logits, count);
        cpu::cross_entropy_backward(v.out(dlogits, count), in, lse, targets, dloss, N, vocab_begin,
                                    V, Vp_local);
        v.commit();
    }

    void nf4_dequantize(Ptr out, const Nf4Matrix& m) override {
        cpu::Fp32Views v(scratch_);
        cpu::nf4_dequantize(v.out(out, m.count), m);
        v.commit();
    }

    void add_mean(double* total, const float* losses, int N) override {
        *total += cpu::mean(losses, N);
    }

    void add_sum_of_squares(double* total, ConstPtr x, std::size_t count) override {
        cpu::Fp32Views v(scratch_);
        *total += cpu::sum_of_squares(v.in(x, count), count);
    }
    void scale(Ptr x, std::size_t count, float factor) override {
        cpu::Fp32Views v(scratch_);
        cpu::scale(v.inout(x, count), count, factor);
        v.commit();
    }
    void adamw_update(float* master, ConstPtr grads, float* m, float* v, std::size_t count,
                      float lr, float beta1, float beta2, float eps, float weight_decay, int step,
                      float grad_scale, Ptr params) override {
        cpu::Fp32Views views(scratch_);
        cpu::adamw_update(master, views.in(grads, count), m, v, count, lr, beta1, beta2, eps,
                          weight_decay, step, grad_scale, views.out(params, count));
        views.commit();
    }

    void muon_momentum(float* u, float* momentum, ConstPtr grads, std::size_t count, float mu,
                       bool nesterov, float grad_scale) override {
        cpu::Fp32Views v(scratch_);
        cpu::muon_momentum(u, momentum, v.in(grads, count), count, mu, nesterov, grad_scale);
    }
    void muon_update(float* master, const float* direction, std::size_t count, float lr,
                     float weight_decay, Ptr params) override {
        cpu::muon_update(master, direction, count, lr, weight_decay);
        if (params.data) convert(params, master, count);
    }
    void galore_update(float* master, const float* direction, std::size_t count, float lr,
                       float weight_decay, Ptr params) override {
        cpu::galore_update(master, direction, count, lr, weight_decay);
        if (params.data) convert(params, master, count);
    }
    void newton_schulz(float* x, float* scratch, int rows, int cols, int steps,
                       DType precision) override {
        cpu::newton_schulz(x, scratch, rows, cols, steps, precision == DType::bf16);
    }

private:
    static std::size_t probs_size(int B, int NH, int T) {
        return static_cast<std::size_t>(B) * NH * T * T;
    }

    std::unordered_map<const void*, std::size_t> sizes_;  // live buffers and their bytes
    std::size_t allocated_ = 0, peak_ = 0;
    std::vector<std::vector<float>> scratch_;  // fp32 views of 16-bit arguments (Fp32Views)
    std::vector<float> row_;                   // copy_2d's row between two types
    Ptr workspace_;                            // attention_backward's, from allocate()
    std::size_t workspace_count_ = 0;
};

}  // namespace

Ops::AttentionSaved cpu_attention_saved(int B, int NH, int T, DType activations) {
    return {static_cast<std::size_t>(B) * static_cast<std::size_t>(NH) *
                static_cast<std::size_t>(T) * static_cast<std::size_t>(T),
            activations};
}

std::unique_ptr<Ops> make_cpu_ops(int threads) {
    // One pool of threads, OpenMP's, for everything: OpenBLAS runs single-threaded inside
    // our parallel loops, which split each GEMM (matmul.cpp) or run one head per thread
    // (attention.cpp). Two pools taking turns fight for the cores, as each spins for a while
    // after its work: a matmul/GELU/layernorm sequence ran ~30% slower on 2 cores that way.
    // Both settings are process-wide. OpenBLAS goes first, because its OpenMP build's setter
    // also sets OpenMP's thread count.
    // At most a few per usable core (kernels/threads.h): the callers say when they cut it.
    const int count = thread_count(threads, "threads").count;
    openblas_set_num_threads(1);
    omp_set_num_threads(count);
    return std::make_unique<CpuOps>();
}

}  // namespace trident::kernels
