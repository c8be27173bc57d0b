// Ring attention's pieces (kernels/ops.h, "ring attention"): causal attention of a block of
// query rows against a block of key rows, returning each row's log-sum-exp; the merge of two
// blocks' results (the online softmax, block by block); and a block's backward from the whole
// attention's output and log-sum-exp, as flash attention computes it.
//
// Per (batch, head), as attention.cpp does: the (q_count, k_count) scores by one OpenBLAS
// GEMM into a per-thread buffer, a row loop over the visible keys, and GEMMs for the products
// with v, dout, q and k, read in place with their row strides (3·channels for qkv, 2·channels for
// kv, channels for out and dout). Backward, with P = exp(scores - lse) (the whole softmax's
// probabilities on this block), z the dropout factor and D_i = dout_i . out_i:
//   dv += (P z)^T dout,   dS = P (z (dout v^T) - D),   dq += scale dS k,   dk += scale dS^T q.
// Every (batch, head) writes its own rows and columns of dq and dkv, so the threads never add
// into one element and the results repeat bit for bit.
#include <cblas.h>

#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ops.h"

namespace trident::kernels::cpu {

namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

// Where one (b, h) problem of a block lives.
struct BlockHead {
    std::size_t q;  // q of this head at the block's first query row in qkv (row stride 3·channels)
    std::size_t kv;  // k at the block's first key row in kv (row stride 2·channels); v at +channels
    std::size_t out;  // the first query row in out, dout, dq (row stride channels)
    std::size_t lse;  // the first query row in lse (B, NH, q_rows)
    uint64_t mask;    // dropout index of (b, head_begin + h, position 0, position 0)
};

BlockHead block_head(const AttentionBlock& k, int bh) {
    const std::size_t b = static_cast<std::size_t>(bh / k.NH),
                      h = static_cast<std::size_t>(bh % k.NH);
    const std::size_t hs = static_cast<std::size_t>(k.channels / k.NH),
                      channels = static_cast<std::size_t>(k.channels);
    const std::size_t q_row = b * k.q_rows + k.q_begin, k_row = b * k.kv_rows + k.k_begin;
    const uint64_t T = static_cast<uint64_t>(k.seq_len);
    return {q_row * 3 * channels + h * hs, k_row * 2 * channels + h * hs, q_row * channels + h * hs,
            (b * k.NH + h) * k.q_rows + k.q_begin,
            (static_cast<uint64_t>(b) * k.heads_total + k.head_begin + h) * T * T};
}

// Keys visible to query row i of the block: 0 .. count-1.
int visible_keys(const AttentionBlock& k, int i) {
    const int last = k.q_position + i - k.k_position;
    return last < 0 ? 0 : (last + 1 < k.k_count ? last + 1 : k.k_count);
}

// The first key visible to query row i of sequence b: 0, or within documents the start of the
// row's document (AttentionBlock::q_starts), at most count.
int first_key(const AttentionBlock& k, int b, int i) {
    if (!k.q_starts) return 0;
    const int first = k.q_starts[static_cast<std::size_t>(b) * k.q_rows +
                                 static_cast<std::size_t>(k.q_begin + i)] -
                      k.k_position;
    return first < 0 ? 0 : (first < k.k_count ? first : k.k_count);
}

// Whether no query row of sequence b sees a key of the block: within documents, a block of
// keys wholly in earlier documents than every row's (ring attention's whole blocks skipped:
// their keys and values are never read).
bool sees_nothing(const AttentionBlock& k, int b) {
    for (int i = 0; i < k.q_count; i++)
        if (visible_keys(k, i) > first_key(k, b, i)) return false;
    return true;
}

// A head's block output where it sees nothing: zero rows, log-sum-exp -inf.
void nothing_seen(float* out, float* lse, const AttentionBlock& k, const BlockHead& head) {
    const int hs = k.channels / k.NH;
    for (int i = 0; i < k.q_count; i++) {
        lse[head.lse + static_cast<std::size_t>(i)] = kMinusInf;
        float* row = out + head.out + static_cast<std::size_t>(i) * k.channels;
        for (int d = 0; d < hs; d++) row[d] = 0.0f;
    }
}

// Dropout's factor for query row i, key j of the block: 0 or 1/(1 - p); 1 without dropout.
float dropout_factor(const AttentionBlock& k, const BlockHead& head, int i, int j) {
    if (k.drop_prob == 0.0f) return 1.0f;
    const uint64_t index =
        head.mask + static_cast<uint64_t>(k.q_position + i) * static_cast<uint64_t>(k.seq_len) +
        static_cast<uint64_t>(k.k_position + j);
    return dropout_keep(k.seed, index, k.drop_prob) ? 1.0f / (1.0f - k.drop_prob) : 0.0f;
}

// scores (q_count, k_count) = q k^T * scale for one head.
void block_scores(float* scores, const float* qkv, const float* kv, const AttentionBlock& k,
                  const BlockHead& head, float scale) {
    const int hs = k.channels / k.NH;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, k.q_count, k.k_count, hs, scale,
                qkv + head.q, 3 * k.channels, kv + head.kv, 2 * k.channels, 0.0f, scores,
                k.k_count);
}

}  // namespace

void attention_block_forward(float* out, float* lse, const float* qkv, const float* kv,
                             const AttentionBlock& k) {
    const int hs = k.channels / k.NH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel
    {
        std::vector<float> scores(static_cast<std::size_t>(k.q_count) * k.k_count);
#pragma omp for schedule(static)
        for (int bh = 0; bh < k.B * k.NH; bh++) {
            const BlockHead head = block_head(k, bh);
            if (sees_nothing(k, bh / k.NH)) {
                nothing_seen(out, lse, k, head);
                continue;
            }
            block_scores(scores.data(), qkv, kv, k, head, scale);
            // Each row becomes its probabilities over the visible keys [first, visible) (dropped
            // out), zeros elsewhere.
            for (int i = 0; i < k.q_count; i++) {
                float* row = scores.data() + static_cast<std::size_t>(i) * k.k_count;
                const int first = first_key(k, bh / k.NH, i), visible = visible_keys(k, i);
                float* row_lse = lse + head.lse + i;
                if (visible <= first) {
                    *row_lse = kMinusInf;
                    for (int j = 0; j < k.k_count; j++) row[j] = 0.0f;
                    continue;
                }
                float max = kMinusInf;
                for (int j = first; j < visible; j++) max = row[j] > max ? row[j] : max;
                float sum = 0.0f;
                for (int j = first; j < visible; j++) {
                    row[j] = fast_exp(row[j] - max);
                    sum += row[j];
                }
                *row_lse = max + std::log(sum);
                const float inv_sum = 1.0f / sum;
                for (int j = first; j < visible; j++)
                    row[j] *= inv_sum * dropout_factor(k, head, i, j);
                for (int j = 0; j < first; j++) row[j] = 0.0f;
                for (int j = visible; j < k.k_count; j++) row[j] = 0.0f;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, k.q_count, hs, k.k_count, 1.0f,
                        scores.data(), k.k_count, kv + head.kv + k.channels, 2 * k.channels, 0.0f,
                        out + head.out, k.channels);
        }
    }
}

void attention_merge(float* out, float* lse, const float* block_out, const float* block_lse, int B,
                     int rows, int channels, int NH, int row_begin, int row_count) {
    const int hs = channels / NH;
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        const std::size_t b = static_cast<std::size_t>(bh / NH),
                          h = static_cast<std::size_t>(bh % NH);
        for (int r = row_begin; r < row_begin + row_count; r++) {
            const std::size_t stat = (b * NH + h) * rows + r;
            const float a = lse[stat], c = block_lse[stat];
            float* o = out + (b * rows + r) * channels + h * hs;
            const float* ob = block_out + (b * rows + r) * channels + h * hs;
            if (c == kMinusInf) continue;  // the block saw nothing here
            if (a == kMinusInf) {          // nothing seen before it
                lse[stat] = c;
                for (int d = 0; d < hs; d++) o[d] = ob[d];
                continue;
            }
            const float merged =
                a > c ? a + std::log1p(std::exp(c - a)) : c + std::log1p(std::exp(a - c));
            const float wa = std::exp(a - merged), wc = std::exp(c - merged);
            for (int d = 0; d < hs; d++) o[d] = o[d] * wa + ob[d] * wc;
            lse[stat] = merged;
        }
    }
}

void attention_block_backward(float* dq, float* dkv, const float* dout, const float* qkv,
                              const float* kv, const float* out, const float* lse,
                              const AttentionBlock& k) {
    const int hs = k.channels / k.NH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel
    {
        const std::size_t block = static_cast<std::size_t>(k.q_count) * k.k_count;
        std::vector<float> probs(block), dprobs(block);  // P z, then dS
#pragma omp for schedule(static)
        for (int bh = 0; bh < k.B * k.NH; bh++) {
            const BlockHead head = block_head(k, bh);
            if (sees_nothing(k, bh / k.NH)) continue;  // adds nothing
            block_scores(probs.data(), qkv, kv, k, head, scale);
            // dprobs = dout v^T: the gradient of the dropped-out probabilities.
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, k.q_count, k.k_count, hs, 1.0f,
                        dout + head.out, k.channels, kv + head.kv + k.channels, 2 * k.channels,
                        0.0f, dprobs.data(), k.k_count);
            for (int i = 0; i < k.q_count; i++) {
                float* p = probs.data() + static_cast<std::size_t>(i) * k.k_count;
                float* dp = dprobs.data() + static_cast<std::size_t>(i) * k.k_count;
                const int first = first_key(k, bh / k.NH, i), visible = visible_keys(k, i);
                const float row_lse = lse[head.lse + i];
                const float* dout_i = dout + head.out + static_cast<std::size_t>(i) * k.channels;
                const float* out_i = out + head.out + static_cast<std::size_t>(i) * k.channels;
                float dot = 0.0f;  // D_i
                for (int d = 0; d < hs; d++) dot += dout_i[d] * out_i[d];
                for (int j = first; j < visible; j++) {
                    const float prob = fast_exp(p[j] - row_lse);
                    const float z = dropout_factor(k, head, i, j);
                    p[j] = prob * z;
                    dp[j] = prob * (z * dp[j] - dot);
                }
                for (int j = 0; j < first && j < k.k_count; j++) p[j] = dp[j] = 0.0f;
                for (int j = visible > first ? visible : first; j < k.k_count; j++)
                    p[j] = dp[j] = 0.0f;
            }
            float* dk = dkv + head.kv;
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, k.k_count, hs, k.q_count, 1.0f,
                        probs.data(), k.k_count, dout + head.out, k.channels, 1.0f, dk + k.channels,
                        2 * k.channels);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, k.q_count, hs, k.k_count, scale,
                        dprobs.data(), k.k_count, kv + head.kv, 2 * k.channels, 1.0f, dq + head.out,
                        k.channels);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, k.k_count, hs, k.q_count, scale,
                        dprobs.data(), k.k_count, qkv + head.q, 3 * k.channels, 1.0f, dk,
                        2 * k.channels);
        }
    }
}

}  // namespace trident::kernels::cpu
