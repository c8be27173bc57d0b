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
// Within documents (data.documents: mask, model/documents.h) each sequence is cut into the runs of
// its documents, and the GEMMs of a head run over each document's block of the T x T scores
// alone: the masked blocks are never computed, so the work shrinks with the documents. A query
// row softmaxes over [its document's start, itself] and zeroes the rest. Without documents the
// sequence is one run, and every call is what it was.
//
// Under tensor parallelism a rank holds NH of the model's heads_total heads, starting at
// head_begin, with channels = NH * hs its share of the channels; nothing here depends on that
// except the dropout mask. Attention dropout acts on the probabilities: element (b,h,t,j) is
// kept when dropout_keep(seed, its flat index in the whole model's (B,heads_total,T,T), p),
// the index every backend and every split of the heads uses.
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

// One document of a sequence: its rows [begin, end).
struct Run {
    int begin, end;
};

// The documents of sequence b from the document starts (B·T; null: the whole sequence).
std::vector<Run> runs_of(const int32_t* starts, int b, int T) {
    if (!starts) return {{0, T}};
    const int32_t* s = starts + static_cast<std::size_t>(b) * T;
    std::vector<Run> runs;
    for (int t = 0; t < T; t++) {
        if (s[t] == t || runs.empty())
            runs.push_back({t, t + 1});
        else
            runs.back().end = t + 1;
    }
    return runs;
}

// In place on one row of scores (T): softmax over the causal part [0, t], zeros after. A row
// within a document starts at the document (row + its start, T less its start).
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

// The offset of a run's diagonal block in a head's (T,T) scores, and of its first row in a
// tensor of rows `stride` apart.
std::size_t block_at(const Run& r, int T) {
    return static_cast<std::size_t>(r.begin) * T + r.begin;
}
std::size_t row_at(const Run& r, int stride) {
    return static_cast<std::size_t>(r.begin) * stride;
}

// att_bh (T,T) = causal softmax(q k^T * scale) for one head within its documents' blocks: the
// probabilities forward keeps and selective recompute rebuilds, by the same code so they agree
// bit for bit.
void head_probs(float* att_bh, const float* q, const float* k, const std::vector<Run>& runs, int T,
                int channels, int hs, float scale) {
    for (const Run& r : runs) {
        const int n = r.end - r.begin;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, hs, scale,
                    q + row_at(r, 3 * channels), 3 * channels, k + row_at(r, 3 * channels),
                    3 * channels, 0.0f, att_bh + block_at(r, T), T);
        for (int t = r.begin; t < r.end; t++) {
            float* row = att_bh + static_cast<std::size_t>(t) * T;
            std::fill(row, row + r.begin, 0.0f);
            causal_softmax_row(row + r.begin, t - r.begin, T - r.begin);
        }
    }
}

// The backward of one head within one document's block (attention_backward). d (T,T) holds the
// block's P on entry (the probabilities, or their dropped-out form) and its dpre on exit.
struct HeadGrad {
    const float *q, *k, *v, *dout, *att;
    float *dq, *dk, *dv, *d;
};
void run_backward(const HeadGrad& g, const Run& r, int T, int channels, int hs, float scale,
                  float drop_prob, uint64_t seed, uint64_t mask_offset) {
    const int n = r.end - r.begin, qkv_stride = 3 * channels;
    const std::size_t at = block_at(r, T), qkv_row = row_at(r, qkv_stride),
                      out_row = row_at(r, channels);
    const float* weights = drop_prob > 0.0f ? g.d : g.att;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, n, 1.0f, weights + at, T,
                g.dout + out_row, channels, 1.0f, g.dv + qkv_row, qkv_stride);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, hs, 1.0f, g.dout + out_row, channels,
                g.v + qkv_row, qkv_stride, 0.0f, g.d + at, T);
    const float keep_scale = 1.0f / (1.0f - drop_prob);
    for (int t = 0; t < n; t++) {
        // Row r.begin + t from its document's start: columns r.begin ...
        const std::size_t row = static_cast<std::size_t>(r.begin + t) * T + r.begin;
        const float* a = g.att + row;
        float* drow = g.d + row;
        if (drop_prob > 0.0f) {
            for (int j = 0; j <= t; j++) {
                const bool keep = dropout_keep(seed, mask_offset + row + j, drop_prob);
                drow[j] = keep ? drow[j] * keep_scale : 0.0f;
            }
        }
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int j = 0; j <= t; j++) dot += a[j] * drow[j];
        for (int j = 0; j <= t; j++) drow[j] = a[j] * (drow[j] - dot);
        for (int j = t + 1; j < n; j++) drow[j] = 0.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hs, n, scale, g.d + at, T,
                g.k + qkv_row, qkv_stride, 1.0f, g.dq + qkv_row, qkv_stride);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, n, scale, g.d + at, T,
                g.q + qkv_row, qkv_stride, 1.0f, g.dk + qkv_row, qkv_stride);
}

}  // namespace

// att (B,NH,T,T) = causal softmax(q k^T / sqrt(hs)) within documents; out (B,T,channels) =
// dropout(att) @ v, by document.
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int channels, int NH,
                       float drop_prob, uint64_t seed, int head_begin, int heads_total,
                       const int32_t* starts) {
    const int hs = channels / NH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel
    {
        // (T,T) per thread: att must keep the probabilities before dropout for backward.
        std::vector<float> probs(drop_prob > 0.0f ? static_cast<std::size_t>(T) * T : 0);
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            const Head head = head_at(bh, T, channels, NH, head_begin, heads_total);
            const std::vector<Run> runs = runs_of(starts, bh / NH, T);
            const float* q = qkv + head.qkv_offset;  // (T,hs), row stride 3·channels
            const float* k = q + channels;
            const float* v = q + 2 * channels;
            float* att_bh = att + head.att_offset;  // (T,T)
            head_probs(att_bh, q, k, runs, T, channels, hs, scale);
            const float* weights = att_bh;
            if (drop_prob > 0.0f) {
                apply_dropout(probs.data(), att_bh, head.mask_offset, T, drop_prob, seed);
                weights = probs.data();
            }
            for (const Run& r : runs) {
                const int n = r.end - r.begin;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hs, n, 1.0f,
                            weights + block_at(r, T), T, v + row_at(r, 3 * channels), 3 * channels,
                            0.0f, out + head.out_offset + row_at(r, channels), channels);
            }
        }
    }
}

void attention_probs(float* att, const float* qkv, int B, int T, int channels, int NH,
                     const int32_t* starts) {
    const int hs = channels / NH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        const Head head = head_at(bh, T, channels, NH, 0, NH);
        const float* q = qkv + head.qkv_offset;
        head_probs(att + head.att_offset, q, q + channels, runs_of(starts, bh / NH, T), T, channels,
                   hs, scale);
    }
}

// With P = dropout(att) and dP = dout v^T, per head and document block:
//   dv += P^T dout;   datt = dropout'(dP);   dpre = att * (datt - rowsum(att * datt))
//   dq += scale * dpre k;   dk += scale * dpre^T q
// scratch (B,NH,T,T) holds first P, then dP turning into dpre, for each head.
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int channels, int NH, float drop_prob,
                        uint64_t seed, int head_begin, int heads_total, const int32_t* starts) {
    const int hs = channels / NH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        const Head head = head_at(bh, T, channels, NH, head_begin, heads_total);
        const float* q = qkv + head.qkv_offset;  // (T,hs), row stride 3·channels, as are k, v...
        float* dq = dqkv + head.qkv_offset;
        // dout (T,hs) with row stride channels; att and d (T,T).
        const HeadGrad g{
            q,  q + channels,  q + 2 * channels,  dout + head.out_offset,   att + head.att_offset,
            dq, dq + channels, dq + 2 * channels, scratch + head.att_offset};
        if (drop_prob > 0.0f) apply_dropout(g.d, g.att, head.mask_offset, T, drop_prob, seed);
        for (const Run& r : runs_of(starts, bh / NH, T))
            run_backward(g, r, T, channels, hs, scale, drop_prob, seed, head.mask_offset);
    }
}

}  // namespace trident::kernels::cpu
