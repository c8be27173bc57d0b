// Layer normalisation over the channels of each row (eps 1e-5, biased variance, as torch),
// forward and backward.
#include <cmath>
#include <cstddef>

#include "kernels/cpu/cpu_kernels.h"

namespace trident::kernels::cpu {

namespace {
constexpr float kEps = 1e-5f;
}

// out (N,channels) = (inp - mean) * rstd * weight + bias; mean, rstd (N) kept for backward.
// The variance is taken as the mean of (x - mean)^2, a second pass over the (cached) row,
// rather than E[x^2] - mean^2, which cancels badly when |mean| >> std.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int channels) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* x = inp + static_cast<std::size_t>(n) * channels;
        float* y = out + static_cast<std::size_t>(n) * channels;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int c = 0; c < channels; c++) sum += x[c];
        const float m = sum / channels;
        float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
        for (int c = 0; c < channels; c++) sum_sq += (x[c] - m) * (x[c] - m);
        const float s = 1.0f / std::sqrt(sum_sq / channels + kEps);
        for (int c = 0; c < channels; c++) y[c] = (x[c] - m) * s * weight[c] + bias[c];
        mean[n] = m;
        rstd[n] = s;
    }
}

// With norm = (x - mean) * rstd and dnorm = dout * weight:
//   dinp    += rstd * (dnorm - mean_c(dnorm) - norm * mean_c(dnorm * norm))   per row
//   dweight += sum_n dout * norm,  dbias += sum_n dout                         per column
// The row part runs parallel over rows; the column sums run parallel over column blocks
// (recomputing norm), so no two threads ever add into the same element.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int channels) {
#pragma omp parallel for schedule(static) if (dinp != nullptr)
    for (int n = 0; n < (dinp ? N : 0); n++) {
        const float* x = inp + static_cast<std::size_t>(n) * channels;
        const float* dy = dout + static_cast<std::size_t>(n) * channels;
        float* dx = dinp + static_cast<std::size_t>(n) * channels;
        const float m = mean[n];
        const float s = rstd[n];
        float dnorm_sum = 0.0f;
        float dnorm_norm_sum = 0.0f;
#pragma omp simd reduction(+ : dnorm_sum, dnorm_norm_sum)
        for (int c = 0; c < channels; c++) {
            const float dnorm = dy[c] * weight[c];
            dnorm_sum += dnorm;
            dnorm_norm_sum += dnorm * (x[c] - m) * s;
        }
        const float dnorm_mean = dnorm_sum / channels;
        const float dnorm_norm_mean = dnorm_norm_sum / channels;
        for (int c = 0; c < channels; c++) {
            const float norm = (x[c] - m) * s;
            dx[c] += s * (dy[c] * weight[c] - dnorm_mean - norm * dnorm_norm_mean);
        }
    }

    if (dweight == nullptr) return;
    constexpr int kBlock = 64;
    const int blocks = (channels + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
    for (int block = 0; block < blocks; block++) {
        const int c0 = block * kBlock;
        const int width = c0 + kBlock < channels ? kBlock : channels - c0;
        float dw[kBlock] = {};  // (width) partial sums, kept in registers
        float db[kBlock] = {};
        for (int n = 0; n < N; n++) {
            const float* x = inp + static_cast<std::size_t>(n) * channels + c0;
            const float* dy = dout + static_cast<std::size_t>(n) * channels + c0;
            const float m = mean[n];
            const float s = rstd[n];
            for (int c = 0; c < width; c++) {
                dw[c] += dy[c] * (x[c] - m) * s;
                db[c] += dy[c];
            }
        }
        for (int c = 0; c < width; c++) {
            dweight[c0 + c] += dw[c];
            dbias[c0 + c] += db[c];
        }
    }
}

}  // namespace trident::kernels::cpu
