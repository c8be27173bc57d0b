// Causal multi-head self-attention on a packed qkv tensor, forward and backward.
//
// Each (batch, head) pair is an independent problem of a few T x T x hs GEMMs (OpenBLAS,
// single-threaded: see make_cpu_ops) and a row softmax (ours); the pairs are split over
// threads. q, k and v are read in place from qkv (B,T,3·channels) with a row stride of 3·channels,
// and head outputs are written in place into out (B,T,channels) with stride channels: no head is
// copied out or back. The T x T GEMMs also fill the upper triangle, which the row loops ignore and
// zero; skipping it would save half of a small share of the model's FLOPs at the cost of blocked
// GEMMs.
//
// Under tensor parallelism a rank holds NH of the model's heads_total heads, starting at
// head_begin, with channels = NH * hs its share of the channels; nothing here depends on that
// except the dropout mask. Attention dropout acts on the probabilities: element (b,h,t,j) is
// kept when dropout_keep(seed, its flat index in the whole model's (B,heads_total,T,T), p),
// the index every backend and every split of the heads uses.
#include <cblas.h>

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
    std::size_t
        qkv_offset;  // q of this head in qkv (and dq in dqkv); k at +channels, v at +2·channels
    std::size_t out_offset;  // this head's columns in out (B,T,channels)
    std::size_t att_offset;  // this head's (T,T) block in att
    uint64_t mask_offset;    // dropout index of its (0,0) in the model's (B,heads_total,T,T)
};

Head head_at(int bh, int T, int channels, int NH, int head_begin, int heads_total) {
    const std::size_t b = bh / NH;
    const std::size_t h = bh % NH;
    const std::size_t hs = channels / NH;
    const uint64_t global_head = b * heads_total + head_begin + h;
    return {b * T * 3 * channels + h * hs, b * T * channels + h * hs,
            static_cast<std::size_t>(bh) * T * T, global_head * T * T};
}

// In place on one row of scores (T): softmax over the causal part [0, t], zeros after.
void causal_softmax_row(float* row, int t, int T) {
    float max = -std::numeric_limits<float>::infinity();
    // A conditional rather than std::max: GCC 12 does not vectorise the latter here.
#pragma omp simd reduction(max : max)
    for (int j = 0; j <= t; j++) max = row[j] > max ? row[j] : max;
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

// probs (T,T) = dropout(att) for one head's block; mask_offset fixes the mask. The upper
// triangle stays zero, as in att.
void apply_dropout(float* probs, const float* att, uint64_t mask_offset, int T, float drop_prob,
                   uint64_t seed) {
    const float keep_scale = 1.0f / (1.0f - drop_prob);
    for (int t = 0; t < T; t++) {
        const std::size_t row = static_cast<std::size_t>(t) * T;
        for (int j = 0; j <= t; j++) {
            const bool keep = dropout_keep(seed, mask_offset + row + j, drop_prob);
            probs[row + j] = keep ? att[row + j] * keep_scale : 0.0f;
        }
        for (int j = t + 1; j < T; j++) probs[row + j] = 0.0f;
    }
}

// att_bh (T,T) = causal softmax(q k^T * scale) for one head: the probabilities forward keeps
// and selective recompute rebuilds, by the same code so they agree bit for bit.
void head_probs(float* att_bh, const float* q, const float* k, int T, int channels, int hs,
                float scale) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, 3 * channels, k,
                3 * channels, 0.0f, att_bh, T);
    for (int t = 0; t < T; t++) causal_softmax_row(att_bh + static_cast<std::size_t>(t) * T, t, T);
}

}  // namespace

// att (B,NH,T,T) = causal softmax(q k^T / sqrt(hs)); out (B,T,channels) = dropout(att) @ v
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int channels, int NH,
                       float drop_prob, uint64_t seed, int head_begin, int heads_total) {
    const int hs = channels / NH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel
    {
        // (T,T) per thread: att must keep the probabilities before dropout for backward.
        std::vector<float> probs(drop_prob > 0.0f ? static_cast<std::size_t>(T) * T : 0);
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            const Head head = head_at(bh, T, channels, NH, head_begin, heads_total);
            const float* q = qkv + head.qkv_offset;  // (T,hs), row stride 3·channels
            const float* k = q + channels;
            const float* v = q + 2 * channels;
            float* att_bh = att + head.att_offset;  // (T,T)
            head_probs(att_bh, q, k, T, channels, hs, scale);
            const float* weights = att_bh;
            if (drop_prob > 0.0f) {
                apply_dropout(probs.data(), att_bh, head.mask_offset, T, drop_prob, seed);
                weights = probs.data();
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, weights, T, v,
                        3 * channels, 0.0f, out + head.out_offset, channels);
        }
    }
}

void attention_probs(float* att, const float* qkv, int B, int T, int channels, int NH) {
    const int hs = channels / NH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        const Head head = head_at(bh, T, channels, NH, 0, NH);
        const float* q = qkv + head.qkv_offset;
        head_probs(att + head.att_offset, q, q + channels, T, channels, hs, scale);
    }
}

// With P = dropout(att) and dP = dout v^T, per head:
//   dv += P^T dout;   datt = dropout'(dP);   dpre = att * (datt - rowsum(att * datt))
//   dq += scale * dpre k;   dk += scale * dpre^T q
// scratch (B,NH,T,T) holds first P, then dP turning into dpre, for each head.
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int channels, int NH, float drop_prob,
                        uint64_t seed, int head_begin, int heads_total) {
    const int hs = channels / NH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const float keep_scale = 1.0f / (1.0f - drop_prob);
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        const Head head = head_at(bh, T, channels, NH, head_begin, heads_total);
        const float* q =
            qkv + head.qkv_offset;  // (T,hs), row stride 3·channels, as are k, v, dq...
        const float* k = q + channels;
        const float* v = q + 2 * channels;
        float* dq = dqkv + head.qkv_offset;
        float* dk = dq + channels;
        float* dv = dq + 2 * channels;
        const float* dout_bh = dout + head.out_offset;  // (T,hs), row stride channels
        const float* att_bh = att + head.att_offset;    // (T,T)
        float* d = scratch + head.att_offset;           // (T,T)

        const float* weights = att_bh;
        if (drop_prob > 0.0f) {
            apply_dropout(d, att_bh, head.mask_offset, T, drop_prob, seed);
            weights = d;
        }
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, weights, T, dout_bh,
                    channels, 1.0f, dv, 3 * channels);

        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dout_bh, channels, v,
                    3 * channels, 0.0f, d, T);
        for (int t = 0; t < T; t++) {
            const std::size_t row = static_cast<std::size_t>(t) * T;
            const float* a = att_bh + row;
            float* drow = d + row;
            if (drop_prob > 0.0f) {
                for (int j = 0; j <= t; j++) {
                    const bool keep = dropout_keep(seed, head.mask_offset + row + j, drop_prob);
                    drow[j] = keep ? drow[j] * keep_scale : 0.0f;
                }
            }
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int j = 0; j <= t; j++) dot += a[j] * drow[j];
            for (int j = 0; j <= t; j++) drow[j] = a[j] * (drow[j] - dot);
            for (int j = t + 1; j < T; j++) drow[j] = 0.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, d, T, k,
                    3 * channels, 1.0f, dq, 3 * channels);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, d, T, q, 3 * channels,
                    1.0f, dk, 3 * channels);
    }
}

}  // namespace trident::kernels::cpu
