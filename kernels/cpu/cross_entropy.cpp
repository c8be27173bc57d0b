// Softmax cross-entropy over the padded logits of the LM head, forward and backward.
// Only the first V of the Vp columns are real tokens; the padding never enters the softmax
// and gets a zero gradient. Rows are independent and split over threads; within a row the
// loops use fast_exp so they vectorise (this is the widest softmax in the model).
#include <algorithm>
#include <cmath>
#include <cstddef>

#include "kernels/cpu/cpu_kernels.h"

namespace trident::kernels::cpu {

// losses (N) = lse - logits[target]; lse (N) = log sum_{c<V} exp(logits[n,c]).
// The max is subtracted before exponentiating, so every term is in (0, 1]. The sum runs in
// float lanes over blocks of kSumBlock columns (a reduction `omp simd` vectorises; a double
// one it does not) and the block sums are added in double, so the rounding error stays at a
// few float ulps however wide the row.
void cross_entropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                           int N, int V, int Vp) {
    constexpr int kSumBlock = 1024;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* row = logits + static_cast<std::size_t>(n) * Vp;
        float max = row[0];
        // A conditional rather than std::max: GCC 12 does not vectorise the latter here.
#pragma omp simd reduction(max : max)
        for (int c = 0; c < V; c++) max = row[c] > max ? row[c] : max;
        double sum = 0.0;
        for (int c0 = 0; c0 < V; c0 += kSumBlock) {
            const int c1 = std::min(V, c0 + kSumBlock);
            float block_sum = 0.0f;
#pragma omp simd reduction(+ : block_sum)
            for (int c = c0; c < c1; c++) block_sum += fast_exp(row[c] - max);
            sum += block_sum;
        }
        const float row_lse = max + static_cast<float>(std::log(sum));
        lse[n] = row_lse;
        losses[n] = row_lse - row[targets[n]];
    }
}

// dlogits (N,Vp) = (softmax - onehot(target)) * dloss for columns < V, 0 beyond.
// dlogits may be logits itself: each element is read before it is written, at the same
// index, which `omp simd` allows (no dependence between iterations), and the row's other
// input, lse, was saved by the forward pass.
void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                            const int32_t* targets, float dloss, int N, int V, int Vp) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* row = logits + static_cast<std::size_t>(n) * Vp;
        float* drow = dlogits + static_cast<std::size_t>(n) * Vp;
        const float row_lse = lse[n];
#pragma omp simd
        for (int c = 0; c < V; c++) drow[c] = fast_exp(row[c] - row_lse) * dloss;
        drow[targets[n]] -= dloss;
        for (int c = V; c < Vp; c++) drow[c] = 0.0f;
    }
}

}  // namespace trident::kernels::cpu
