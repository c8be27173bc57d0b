// A mixture of experts' routing on the host (see moe_routing.h).
#include "model/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace trident::model {

namespace {

// One token's scores (N) from its logits: softmax's probabilities or sigmoid's values.
void scores_of(const MoeSettings& moe, const float* z, float* out, int n) {
    if (moe.router == MoeRouter::sigmoid) {
        for (int e = 0; e < n; ++e) out[e] = 1.0f / (1.0f + std::exp(-z[e]));
        return;
    }
    const float top = *std::max_element(z, z + n);
    float sum = 0;
    for (int e = 0; e < n; ++e) sum += out[e] = std::exp(z[e] - top);
    for (int e = 0; e < n; ++e) out[e] /= sum;
}

float logsumexp(const float* z, int n) {
    const float top = *std::max_element(z, z + n);
    float sum = 0;
    for (int e = 0; e < n; ++e) sum += std::exp(z[e] - top);
    return top + std::log(sum);
}

// The k experts of a token, highest score + bias first, the lower index on a tie.
void top_k(const float* score, const float* bias, int n, int k, int32_t* chosen) {
    std::vector<int32_t> order(static_cast<std::size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    const auto key = [&](int32_t e) { return score[e] + (bias ? bias[e] : 0.0f); };
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        return key(a) > key(b) || (key(a) == key(b) && a < b);
    });
    std::copy(order.begin(), order.begin() + k, chosen);
}

// The permutation: each expert's choices contiguous, in token order, but for those dropped.
void permute(MoeRouting& r) {
    const std::size_t choices = r.expert.size();
    const auto kept = [&r](std::size_t c) { return r.dropped.empty() || r.dropped[c] == 0; };
    r.offset.assign(static_cast<std::size_t>(r.experts) + 1, 0);
    for (std::size_t c = 0; c < choices; ++c)
        if (kept(c)) ++r.offset[static_cast<std::size_t>(r.expert[c]) + 1];
    std::partial_sum(r.offset.begin(), r.offset.end(), r.offset.begin());
    std::vector<int32_t> next(r.offset.begin(), r.offset.end() - 1);
    r.token.assign(static_cast<std::size_t>(r.permuted()), 0);
    r.row_of.assign(choices, -1);
    for (std::size_t c = 0; c < choices; ++c) {
        if (!kept(c)) continue;
        const int32_t row = next[static_cast<std::size_t>(r.expert[c])]++;
        r.row_of[c] = row;
        r.token[static_cast<std::size_t>(row)] = static_cast<int32_t>(c / r.k);
    }
}

// Megatron-Core's "probs" drop policy: each expert keeps its `capacity` choices of the highest
// weight, the earlier token first among equal weights; the others' weights become 0, and the
// permutation (whose rows in token order it reads) is made again without them.
void drop_over_capacity(MoeRouting& r, int capacity) {
    r.dropped.assign(r.expert.size(), 0);
    for (int e = 0; e < r.experts; ++e) {
        const std::size_t first = static_cast<std::size_t>(r.offset[static_cast<std::size_t>(e)]);
        if (r.count(e) <= capacity) continue;
        // The expert's choices in token order (the order of its permuted rows).
        std::vector<std::size_t> choices(static_cast<std::size_t>(r.count(e)));
        for (std::size_t c = 0; c < r.expert.size(); ++c)
            if (r.expert[c] == e) choices[static_cast<std::size_t>(r.row_of[c]) - first] = c;
        std::stable_sort(choices.begin(), choices.end(),
                         [&](std::size_t a, std::size_t b) { return r.weight[a] > r.weight[b]; });
        for (std::size_t i = static_cast<std::size_t>(capacity); i < choices.size(); ++i) {
            r.dropped[choices[i]] = 1;
            r.weight[choices[i]] = 0;
            ++r.dropped_count;
        }
    }
    permute(r);
}

}  // namespace

int expert_capacity(const MoeSettings& moe, int rows) {
    return static_cast<int>(std::ceil(moe.capacity_factor * rows * moe.top_k / moe.experts));
}

MoeRouting route(const MoeSettings& moe, const float* logits, const float* bias, int rows) {
    MoeRouting r;
    r.rows = rows;
    r.k = moe.top_k;
    r.experts = moe.experts;
    const int n = moe.experts, k = moe.top_k;
    r.expert.resize(static_cast<std::size_t>(rows) * k);
    r.weight.resize(r.expert.size());
    r.probs.resize(static_cast<std::size_t>(rows) * n);
    r.lse.resize(static_cast<std::size_t>(rows));
    std::vector<float> score(static_cast<std::size_t>(n));
    for (int t = 0; t < rows; ++t) {
        const float* z = logits + static_cast<std::size_t>(t) * n;
        int32_t* chosen = r.expert.data() + static_cast<std::size_t>(t) * k;
        float* w = r.weight.data() + static_cast<std::size_t>(t) * k;
        float* p = r.probs.data() + static_cast<std::size_t>(t) * n;
        scores_of(moe, z, score.data(), n);
        top_k(score.data(), moe.router == MoeRouter::sigmoid ? bias : nullptr, n, k, chosen);
        float sum = 0;
        for (int s = 0; s < k; ++s) sum += score[static_cast<std::size_t>(chosen[s])];
        const float norm = moe.normalize_top_k ? sum : 1.0f;
        for (int s = 0; s < k; ++s)
            w[s] =
                score[static_cast<std::size_t>(chosen[s])] / norm * static_cast<float>(moe.scale);
        const float all = std::accumulate(score.begin(), score.end(), 0.0f);
        for (int e = 0; e < n; ++e)
            p[e] = moe.router == MoeRouter::sigmoid ? score[static_cast<std::size_t>(e)] / all
                                                    : score[static_cast<std::size_t>(e)];
        r.lse[static_cast<std::size_t>(t)] = logsumexp(z, n);
    }
    permute(r);
    r.chosen.assign(r.offset.begin() + 1, r.offset.end());
    std::adjacent_difference(r.chosen.begin(), r.chosen.end(), r.chosen.begin());
    if (moe.capacity_factor > 0) drop_over_capacity(r, expert_capacity(moe, rows));
    return r;
}

namespace {

// d score (N) of one token from the gradient of its k weights.
void weights_backward(const MoeSettings& moe, const float* score, const int32_t* chosen,
                      const float* dw, int k, float* dscore) {
    const float c = static_cast<float>(moe.scale);
    if (!moe.normalize_top_k) {
        for (int s = 0; s < k; ++s) dscore[chosen[s]] += c * dw[s];
        return;
    }
    // w_s = c·q_s / Q, Q = Σ_k q: dq_j = c / Q · (dw_j − Σ_s dw_s·q_s / Q).
    float sum = 0, dot = 0;
    for (int s = 0; s < k; ++s) sum += score[chosen[s]];
    for (int s = 0; s < k; ++s) dot += dw[s] * score[chosen[s]];
    for (int s = 0; s < k; ++s) dscore[chosen[s]] += c / sum * (dw[s] - dot / sum);
}

}  // namespace

void route_backward(const MoeSettings& moe, const MoeRouting& r, const float* logits,
                    const float* d_weight, const MoeLossGrads& losses, float* dlogits) {
    const int n = r.experts, k = r.k;
    const bool sigmoid = moe.router == MoeRouter::sigmoid;
    const float aux = static_cast<float>(moe.aux_loss) * static_cast<float>(n) * losses.dloss;
    const float zc = static_cast<float>(moe.z_loss) * 2.0f * losses.dloss;
    std::vector<float> score(static_cast<std::size_t>(n)), dscore(score.size()), dp(score.size());
    std::vector<float> dw(d_weight, d_weight + r.expert.size());
    for (std::size_t c = 0; c < r.dropped.size(); ++c)  // a dropped weight is a constant 0
        if (r.dropped[c]) dw[c] = 0;
    for (int t = 0; t < r.rows; ++t) {
        const std::size_t row = static_cast<std::size_t>(t);
        const float* z = logits + row * n;
        const float* p = r.probs.data() + row * n;
        float* dz = dlogits + row * n;
        scores_of(moe, z, score.data(), n);
        std::fill(dscore.begin(), dscore.end(), 0.0f);
        weights_backward(moe, score.data(), r.expert.data() + row * k, dw.data() + row * k, k,
                         dscore.data());
        // The balancing loss N·Σ f_e·P_e: dP/dp = 1 / tokens, weighted into dloss.
        for (int e = 0; e < n; ++e) dp[e] = aux * losses.load[e];
        if (sigmoid) {  // p = s / Σ s
            const float all = std::accumulate(score.begin(), score.end(), 0.0f);
            float dot = 0;
            for (int e = 0; e < n; ++e) dot += dp[e] * p[e];
            for (int e = 0; e < n; ++e) dscore[e] += (dp[e] - dot) / all;
            for (int e = 0; e < n; ++e) dz[e] += dscore[e] * score[e] * (1.0f - score[e]);
        } else {  // p = s = softmax(z)
            float dot = 0;
            for (int e = 0; e < n; ++e) dot += (dscore[e] + dp[e]) * p[e];
            for (int e = 0; e < n; ++e) dz[e] += p[e] * (dscore[e] + dp[e] - dot);
        }
        // The z-loss (logsumexp z)²: 2·lse·softmax(z).
        const float lse = r.lse[row];
        if (zc != 0)
            for (int e = 0; e < n; ++e) dz[e] += zc * lse * std::exp(z[e] - lse);
    }
}

}  // namespace trident::model
