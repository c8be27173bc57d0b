// Vocab-parallel softmax cross-entropy over the LM head's logits, forward and backward.
//
// A rank holds the logit columns [vocab_begin, vocab_begin + Vp_local) of the padded
// vocabulary; of these, the ones at or past V are padding, never enter the softmax and get a
// zero gradient. The forward is three ops with a reduction over the ranks between each (see
// kernels/ops.h): the partials pass does the work, a pass over every logit; rescale and losses
// touch N numbers. Rows are independent and split over threads; within a row the loops use
// fast_exp so they vectorise (this is the widest softmax in the model).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "kernels/cpu/cpu_kernels.h"

namespace trident::kernels::cpu {

namespace {

// The slice's real columns are [0, real_columns): a slice may hold real tokens only, real
// tokens then padding, or padding only.
int real_columns(int vocab_begin, int V, int Vp_local) {
    return std::clamp(V - vocab_begin, 0, Vp_local);
}

// The target's column in the slice, or -1 when another rank holds it.
int target_column(int32_t target, int vocab_begin, int real) {
    const int column = target - vocab_begin;
    return column >= 0 && column < real ? column : -1;
}

}  // namespace

// Per row of the slice: row_max = max of the real logits (-inf if none), row_sumexp = sum of
// exp(logit - row_max) over them (0 if none), target_logit = the target's logit (0 if another
// rank holds it). The max is subtracted before exponentiating, so every term is in (0, 1].
// The sum runs in float lanes over blocks of kSumBlock columns (a reduction `omp simd`
// vectorises; a double one it does not) and the block sums are added in double, so the
// rounding error stays at a few float ulps however wide the row.
void cross_entropy_partials(float* row_max, float* row_sumexp, float* target_logit,
                            const float* logits, const int32_t* targets, int N, int vocab_begin,
                            int V, int Vp_local) {
    constexpr int kSumBlock = 1024;
    const int real = real_columns(vocab_begin, V, Vp_local);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* row = logits + static_cast<std::size_t>(n) * Vp_local;
        float max = -std::numeric_limits<float>::infinity();
        // A conditional rather than std::max: GCC 12 does not vectorise the latter here.
#pragma omp simd reduction(max : max)
        for (int c = 0; c < real; c++) max = row[c] > max ? row[c] : max;
        double sum = 0.0;
        for (int c0 = 0; c0 < real; c0 += kSumBlock) {
            const int c1 = std::min(real, c0 + kSumBlock);
            float block_sum = 0.0f;
#pragma omp simd reduction(+ : block_sum)
            for (int c = c0; c < c1; c++) block_sum += fast_exp(row[c] - max);
            sum += block_sum;
        }
        row_max[n] = max;
        row_sumexp[n] = static_cast<float>(sum);
        const int target = target_column(targets[n], vocab_begin, real);
        target_logit[n] = target >= 0 ? row[target] : 0.0f;
    }
}

// row_sumexp *= exp(row_max - global_max): each slice's sum brought to the common max, so the
// slices' sums can be added. A slice without real columns (row_max -inf, sum 0) stays 0; the
// test comes first because exp(-inf - -inf) would be NaN were global_max -inf too. N numbers:
// a serial loop, cheaper than waking the threads.
void cross_entropy_rescale(float* row_sumexp, const float* row_max, const float* global_max,
                           int N) {
    for (int n = 0; n < N; n++) {
        row_sumexp[n] =
            row_sumexp[n] > 0.0f ? row_sumexp[n] * std::exp(row_max[n] - global_max[n]) : 0.0f;
    }
}

// lse (N) = global_max + log(row_sumexp); losses (N) = lse - target_logit, with row_sumexp and
// target_logit summed over the slices.
void cross_entropy_losses(float* losses, float* lse, const float* global_max,
                          const float* row_sumexp, const float* target_logit, int N) {
    for (int n = 0; n < N; n++) {
        const float row_lse = global_max[n] + std::log(row_sumexp[n]);
        lse[n] = row_lse;
        losses[n] = row_lse - target_logit[n];
    }
}

// One microbatch's loss: in order and in double, the same on every run and thread count.
float mean(const float* losses, int N) {
    double sum = 0.0;
    for (int n = 0; n < N; n++) sum += losses[n];
    return static_cast<float>(sum / N);
}

// dlogits (N,Vp_local) = (softmax - onehot(target)) * dloss on the real columns, 0 on the
// padding; the softmax of a column is exp(logit - lse) with the global lse, so the slice needs
// nothing from the other ranks. dlogits may be logits itself: each element is read before it
// is written, at the same index, which `omp simd` allows (no dependence between iterations).
void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                            const int32_t* targets, float dloss, int N, int vocab_begin, int V,
                            int Vp_local) {
    const int real = real_columns(vocab_begin, V, Vp_local);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* row = logits + static_cast<std::size_t>(n) * Vp_local;
        float* drow = dlogits + static_cast<std::size_t>(n) * Vp_local;
        const float row_lse = lse[n];
#pragma omp simd
        for (int c = 0; c < real; c++) drow[c] = fast_exp(row[c] - row_lse) * dloss;
        const int target = target_column(targets[n], vocab_begin, real);
        if (target >= 0) drow[target] -= dloss;
        for (int c = real; c < Vp_local; c++) drow[c] = 0.0f;
    }
}

}  // namespace trident::kernels::cpu
