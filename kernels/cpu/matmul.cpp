// Linear layer y = x W^T + b with W in the [out, in] layout: the GEMMs go to OpenBLAS, the
// bias loops are ours.
#include <cblas.h>

#include <cstddef>

#include "kernels/cpu/cpu_kernels.h"

namespace trident::kernels::cpu {

// out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC). The bias is written first and the
// GEMM accumulates onto it (beta 1), saving a second pass over out.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC) {
    float beta = 0.0f;
    if (bias != nullptr) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            float* row = out + static_cast<std::size_t>(n) * OC;
            for (int o = 0; o < OC; o++) row[o] = bias[o];
        }
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, beta,
                out, OC);
}

// dinp (N,C) += dout (N,OC) @ weight (OC,C); dweight (OC,C) += dout^T @ inp (N,C);
// dbias (OC) += column sums of dout. OpenBLAS splits a GEMM over output tiles, never over
// the summed dimension, so with a fixed thread count its results repeat bit for bit.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int C, int OC) {
    if (dinp != nullptr) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight,
                    C, 1.0f, dinp, C);
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f,
                dweight, C);
    if (dbias != nullptr) {
        // Parallel over column blocks: each thread sums its columns over all rows in order.
        constexpr int kBlock = 64;
        const int blocks = (OC + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
        for (int block = 0; block < blocks; block++) {
            const int o0 = block * kBlock;
            const int width = o0 + kBlock < OC ? kBlock : OC - o0;
            float sum[kBlock] = {};  // (width)
            for (int n = 0; n < N; n++) {
                const float* row = dout + static_cast<std::size_t>(n) * OC + o0;
                for (int o = 0; o < width; o++) sum[o] += row[o];
            }
            for (int o = 0; o < width; o++) dbias[o0 + o] += sum[o];
        }
    }
}

}  // namespace trident::kernels::cpu
