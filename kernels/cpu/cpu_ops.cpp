// The CPU backend: CpuOps implements the Ops interface on host memory, owning the memory
// functions itself and forwarding every op to the kernels in this folder (cpu_kernels.h).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>

#include "error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ops.h"

namespace trident::kernels {
namespace {

// 64 bytes: a cache line, and the width of an AVX-512 register.
constexpr std::size_t kAlignment = 64;

class CpuOps final : public Ops {
public:
    const char* name() const override { return "cpu"; }

    float* allocate(std::size_t count) override {
        // aligned_alloc wants a size that is a multiple of the alignment (and not 0).
        const std::size_t bytes = std::max<std::size_t>(
            kAlignment, (count * sizeof(float) + kAlignment - 1) / kAlignment * kAlignment);
        auto* buffer = static_cast<float*>(std::aligned_alloc(kAlignment, bytes));
        if (buffer == nullptr) {
            throw Error(std::string(__FILE__) + ":" + std::to_string(__LINE__) +
                        ": out of host memory allocating " + std::to_string(bytes) +
                        " bytes; try a smaller batch or model");
        }
        zero(buffer, count);
        sizes_[buffer] = bytes;
        allocated_ += bytes;
        peak_ = std::max(peak_, allocated_);
        return buffer;
    }
    void release(float* buffer) override {
        const auto it = sizes_.find(buffer);
        allocated_ -= it->second;
        sizes_.erase(it);
        std::free(buffer);
    }
    std::size_t allocated_bytes() const override { return allocated_; }
    std::size_t peak_allocated_bytes() const override { return peak_; }
    void reset_peak_allocated_bytes() override { peak_ = allocated_; }
    void copy_to_host(float* host, const float* device, std::size_t count) override {
        copy(host, device, count);
    }
    void copy_from_host(float* device, const float* host, std::size_t count) override {
        copy(device, host, count);
    }
    void zero(float* x, std::size_t count) override {
        if (count > 0) std::memset(x, 0, count * sizeof(float));
    }
    void copy(float* out, const float* in, std::size_t count) override {
        if (count > 0 && out != in) std::memcpy(out, in, count * sizeof(float));
    }

    void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                           int B, int T, int C, int vocab_begin, int vocab_local) override {
        cpu::embedding_forward(out, tokens, wte, wpe, B, T, C, vocab_begin, vocab_local);
    }
    void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                            int B, int T, int C, int vocab_begin, int vocab_local) override {
        cpu::embedding_backward(dwte, dwpe, dout, tokens, B, T, C, vocab_begin, vocab_local);
    }

    void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                           const float* weight, const float* bias, int N, int C) override {
        cpu::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
    }
    void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                            const float* inp, const float* weight, const float* mean,
                            const float* rstd, int N, int C) override {
        cpu::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
    }

    void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                        int C, int OC) override {
        cpu::matmul_forward(out, inp, weight, bias, N, C, OC);
    }
    void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                         const float* inp, const float* weight, int N, int C, int OC) override {
        cpu::matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
    }
    void add_bias(float* out, const float* bias, int N, int OC) override {
        cpu::add_bias(out, bias, N, OC);
    }

    void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH,
                           float drop_prob, uint64_t seed, int head_begin,
                           int heads_total) override {
        cpu::attention_forward(out, att, qkv, B, T, C, NH, drop_prob, seed, head_begin,
                               heads_total);
    }
    void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                            const float* att, int B, int T, int C, int NH, float drop_prob,
                            uint64_t seed, int head_begin, int heads_total) override {
        cpu::attention_backward(dqkv, scratch, dout, qkv, att, B, T, C, NH, drop_prob, seed,
                                head_begin, heads_total);
    }
    void attention_probs(float* att, const float* qkv, int B, int T, int C, int NH) override {
        cpu::attention_probs(att, qkv, B, T, C, NH);
    }

    void gelu_forward(float* out, const float* inp, std::size_t count) override {
        cpu::gelu_forward(out, inp, count);
    }
    void gelu_backward(float* dinp, const float* inp, const float* dout,
                       std::size_t count) override {
        cpu::gelu_backward(dinp, inp, dout, count);
    }
    void residual_forward(float* out, const float* a, const float* b, std::size_t count) override {
        cpu::residual_forward(out, a, b, count);
    }
    void dropout_forward(float* out, const float* inp, std::size_t count, float drop_prob,
                         uint64_t seed, uint64_t index_begin) override {
        cpu::dropout_forward(out, inp, count, drop_prob, seed, index_begin);
    }
    void dropout_backward(float* dinp, const float* dout, std::size_t count, float drop_prob,
                          uint64_t seed, uint64_t index_begin) override {
        cpu::dropout_backward(dinp, dout, count, drop_prob, seed, index_begin);
    }

    void cross_entropy_partials(float* row_max, float* row_sumexp, float* target_logit,
                                const float* logits, const int32_t* targets, int N, int vocab_begin,
                                int V, int Vp_local) override {
        cpu::cross_entropy_partials(row_max, row_sumexp, target_logit, logits, targets, N,
                                    vocab_begin, V, Vp_local);
    }
    void cross_entropy_rescale(float* row_sumexp, const float* row_max, const float* global_max,
                               int N) override {
        cpu::cross_entropy_rescale(row_sumexp, row_max, global_max, N);
    }
    void cross_entropy_losses(float* losses, float* lse, const float* global_max,
                              const float* row_sumexp, const float* target_logit, int N) override {
        cpu::cross_entropy_losses(losses, lse, global_max, row_sumexp, target_logit, N);
    }
    void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                                const int32_t* targets, float dloss, int N, int vocab_begin, int V,
                                int Vp_local) override {
        cpu::cross_entropy_backward(dlogits, logits, lse, targets, dloss, N, vocab_begin, V,
                                    Vp_local);
    }

    double sum_of_squares(const float* x, std::size_t count) override {
        return cpu::sum_of_squares(x, count);
    }
    void scale(float* x, std::size_t count, float factor) override { cpu::scale(x, count, factor); }
    void adamw_update(float* params, const float* grads, float* m, float* v, std::size_t count,
                      float lr, float beta1, float beta2, float eps, float weight_decay,
                      int step) override {
        cpu::adamw_update(params, grads, m, v, count, lr, beta1, beta2, eps, weight_decay, step);
    }

private:
    std::unordered_map<const float*, std::size_t> sizes_;  // live buffers and their bytes
    std::size_t allocated_ = 0, peak_ = 0;
};

}  // namespace

std::unique_ptr<Ops> make_cpu_ops(int threads) {
    // One pool of threads, OpenMP's, for everything: OpenBLAS runs single-threaded inside
    // our parallel loops, which split each GEMM (matmul.cpp) or run one head per thread
    // (attention.cpp). Two pools taking turns fight for the cores, as each spins for a while
    // after its work: a matmul/GELU/layernorm sequence ran ~30% slower on 2 cores that way.
    // Both settings are process-wide. OpenBLAS goes first, because its OpenMP build's setter
    // also sets OpenMP's thread count.
    const int count = threads > 0 ? threads : omp_get_num_procs();
    openblas_set_num_threads(1);
    omp_set_num_threads(count);
    return std::make_unique<CpuOps>();
}

}  // namespace trident::kernels
