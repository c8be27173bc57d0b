// Root-mean-square normalisation over the channels of each row (Llama's RMSNorm, as Hugging
// Face's LlamaRMSNorm computes it in fp32), forward and backward.
#include <cmath>
#include <cstddef>

#include "kernels/cpu/cpu_kernels.h"

namespace trident::kernels::cpu {

// out (N,channels) = inp * rstd * weight, rstd (N) = 1 / sqrt(mean_c(inp^2) + eps) kept for
// backward.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N,
                     int channels, float eps) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* x = inp + static_cast<std::size_t>(n) * channels;
        float* y = out + static_cast<std::size_t>(n) * channels;
        float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
        for (int c = 0; c < channels; c++) sum_sq += x[c] * x[c];
        const float s = 1.0f / std::sqrt(sum_sq / channels + eps);
        for (int c = 0; c < channels; c++) y[c] = x[c] * s * weight[c];
        rstd[n] = s;
    }
}

// With dnorm = dout * weight, per row:
//   dinp    += rstd * dnorm - inp * rstd^3 * mean_c(dnorm * inp)
//   dweight += sum_n dout * inp * rstd                              per column
// The row part runs parallel over rows, the column sums over column blocks, so no two threads
// add into the same element.
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int channels) {
#pragma omp parallel for schedule(static) if (dinp != nullptr)
    for (int n = 0; n < (dinp ? N : 0); n++) {
        const float* x = inp + static_cast<std::size_t>(n) * channels;
        const float* dy = dout + static_cast<std::size_t>(n) * channels;
        float* dx = dinp + static_cast<std::size_t>(n) * channels;
        const float s = rstd[n];
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int c = 0; c < channels; c++) dot += dy[c] * weight[c] * x[c];
        const float k = s * s * s * dot / channels;
        for (int c = 0; c < channels; c++) dx[c] += s * dy[c] * weight[c] - x[c] * k;
    }

    if (dweight == nullptr) return;
    constexpr int kBlock = 64;
    const int blocks = (channels + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
    for (int block = 0; block < blocks; block++) {
        const int c0 = block * kBlock;
        const int width = c0 + kBlock < channels ? kBlock : channels - c0;
        float dw[kBlock] = {};  // (width) partial sums
        for (int n = 0; n < N; n++) {
            const float* x = inp + static_cast<std::size_t>(n) * channels + c0;
            const float* dy = dout + static_cast<std::size_t>(n) * channels + c0;
            const float s = rstd[n];
            for (int c = 0; c < width; c++) dw[c] += dy[c] * x[c] * s;
        }
        for (int c = 0; c < width; c++) dweight[c0 + c] += dw[c];
    }
}

}  // namespace trident::kernels::cpu
