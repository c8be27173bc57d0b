// Causal multi-head self-attention on a packed qkv tensor, forward and backward.
//
// Each (batch, head) pair is an independent problem of a few T x T x hs GEMMs (OpenBLAS)
// and a row softmax (ours); the pairs are split over threads. q, k and v are read in place
// from qkv (B,T,3C) with a row stride of 3C, and head outputs are written in place into
// out (B,T,C) with stride C, so no head is ever copied out or back.
//
// Attention dropout acts on the probabilities: element (b,h,t,j) of att is kept when
// dropout_keep(seed, its flat index in att (B,NH,T,T), p), the same index every backend uses.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ops.h"

namespace trident::kernels::cpu {

namespace {

// Where one (b, h) problem lives in the packed tensors.
struct Head {
    const float* q;  // (T, hs), row stride 3C
    const float* k;  // (T, hs), row stride 3C
    const float* v;  // (T, hs), row stride 3C
    std::size_t att_offset;  // start of this head's (T,T) block in att
};

Head head_at(const float* qkv, int b, int h, int T, int C, int NH) {
    const int hs = C / NH;
    const float* q = qkv + static_cast<std::size_t>(b) * T * 3 * C + static_cast<std::size_t>(h) * hs;
    return {q, q + C, q + 2 * C, (static_cast<std::size_t>(b) * NH + h) * T * T};
}

// OpenBLAS's pthread build would start its own threads inside ours (its OpenMP build notices
// it is inside a parallel region and does not). Each head's GEMMs are small, so inside the
// head loop they run single-threaded; the thread count is restored afterwards.
class SingleThreadedBlas {
public:
    SingleThreadedBlas()
        : threads_(openblas_get_num_threads()), pthreads_(openblas_get_parallel() == 1) {
        // The OpenMP build's setter also sets OpenMP's thread count, so leave that build be.
        if (pthreads_) openblas_set_num_threads(1);
    }
    ~SingleThreadedBlas() {
        if (pthreads_) openblas_set_num_threads(threads_);
    }
    SingleThreadedBlas(const SingleThreadedBlas&) = delete;
    SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

private:
    int threads_;
    bool pthreads_;
};

// probs (T,T) = att (T,T) with dropout applied; att_offset is the block's place in att,
// which fixes the mask. The upper triangle stays zero, as in att.
void apply_dropout(float* probs, const float* att, std::size_t att_offset, int T,
                   float drop_prob, uint64_t seed) {
    const float keep_scale = 1.0f / (1.0f - drop_prob);
    for (int t = 0; t < T; t++) {
        const std::size_t row = static_cast<std::size_t>(t) * T;
        for (int j = 0; j <= t; j++) {
            probs[row + j] =
                dropout_keep(seed, att_offset + row + j, drop_prob) ? att[row + j] * keep_scale
                                                                    : 0.0f;
        }
        for (int j = t + 1; j < T; j++) probs[row + j] = 0.0f;
    }
}

}  // namespace

// att (B,NH,T,T) = causal softmax(q k^T / sqrt(hs)); out (B,T,C) = dropout(att) @ v
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH,
                       float drop_prob, uint64_t seed) {
    const int hs = C / NH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const SingleThreadedBlas single_threaded_blas;
#pragma omp parallel
    {
        std::vector<float> probs(drop_prob > 0.0f ? static_cast<std::size_t>(T) * T : 0);  // (T,T)
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            const int b = bh / NH;
            const int h = bh % NH;
            const Head head = head_at(qkv, b, h, T, C, NH);
            float* att_bh = att + head.att_offset;  // (T,T)
            // The GEMM fills the whole square; the softmax below reads only the causal part
            // and zeroes the rest.
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, head.q, 3 * C,
                        head.k, 3 * C, 0.0f, att_bh, T);
            for (int t = 0; t < T; t++) {
                float* row = att_bh + static_cast<std::size_t>(t) * T;
                float max = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : max)
                for (int j = 0; j <= t; j++) max = row[j] > max ? row[j] : max;  // vectorises
                float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
                for (int j = 0; j <= t; j++) {
                    row[j] = fast_exp(row[j] - max);
                    sum += row[j];
                }
                const float inv_sum = 1.0f / sum;
                for (int j = 0; j <= t; j++) row[j] *= inv_sum;
                for (int j = t + 1; j < T; j++) row[j] = 0.0f;
            }
            const float* weights = att_bh;
            if (drop_prob > 0.0f) {
                apply_dropout(probs.data(), att_bh, head.att_offset, T, drop_prob, seed);
                weights = probs.data();
            }
            float* out_bh = out + static_cast<std::size_t>(b) * T * C + static_cast<std::size_t>(h) * hs;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, weights, T,
                        head.v, 3 * C, 0.0f, out_bh, C);
        }
    }
}

// With P = dropout(att) and dP = dout v^T:
//   dv += P^T dout;   datt = dropout'(dP);   dpre = att * (datt - rowsum(att * datt))
//   dq += scale * dpre k;   dk += scale * dpre^T q
// scratch (B,NH,T,T) holds P and then dpre for each head.
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int NH, float drop_prob,
                        uint64_t seed) {
    const int hs = C / NH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const float keep_scale = 1.0f / (1.0f - drop_prob);
    const SingleThreadedBlas single_threaded_blas;
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        const int b = bh / NH;
        const int h = bh % NH;
        const Head head = head_at(qkv, b, h, T, C, NH);
        // The gradient heads sit at the same offsets in dqkv as the inputs in qkv.
        const std::size_t qkv_offset = head.q - qkv;
        float* dq = dqkv + qkv_offset;
        float* dk = dq + C;
        float* dv = dq + 2 * C;
        const float* att_bh = att + head.att_offset;  // (T,T)
        float* d = scratch + head.att_offset;         // (T,T)
        const float* dout_bh = dout + static_cast<std::size_t>(b) * T * C + static_cast<std::size_t>(h) * hs;

        const float* weights = att_bh;
        if (drop_prob > 0.0f) {
            apply_dropout(d, att_bh, head.att_offset, T, drop_prob, seed);
            weights = d;
        }
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, weights, T, dout_bh,
                    C, 1.0f, dv, 3 * C);

        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dout_bh, C, head.v,
                    3 * C, 0.0f, d, T);
        for (int t = 0; t < T; t++) {
            const std::size_t row = static_cast<std::size_t>(t) * T;
            const float* a = att_bh + row;
            float* dr = d + row;
            if (drop_prob > 0.0f) {
                for (int j = 0; j <= t; j++) {
                    dr[j] = dropout_keep(seed, head.att_offset + row + j, drop_prob)
                                ? dr[j] * keep_scale
                                : 0.0f;
                }
            }
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int j = 0; j <= t; j++) dot += a[j] * dr[j];
            for (int j = 0; j <= t; j++) dr[j] = a[j] * (dr[j] - dot);
            for (int j = t + 1; j < T; j++) dr[j] = 0.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, d, T, head.k,
                    3 * C, 1.0f, dq, 3 * C);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, d, T, head.q,
                    3 * C, 1.0f, dk, 3 * C);
    }
}

}  // namespace trident::kernels::cpu
