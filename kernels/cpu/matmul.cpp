// Linear layer y = x W^T + b with W in the [out, in] layout: the GEMMs go to OpenBLAS, split
// over our threads; the bias loops are ours, add_bias (a row-parallel linear's bias, added
// after the reduction) included.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstddef>

#include "kernels/cpu/cpu_kernels.h"

namespace trident::kernels::cpu {

namespace {

// c (m,n) = alpha op(a) op(b) + beta c (BLAS's sgemm in its own names), row-major, split over
// the OpenMP threads by blocks of c along its longer side, each block one single-threaded
// sgemm (why: make_cpu_ops). For large GEMMs this is as fast as OpenBLAS's own threading.
// Every block runs over the whole inner dimension k, so each element is summed in one order,
// the same on every run.
void parallel_sgemm(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int m, int n, int k,
                    float alpha, const float* a, int lda, const float* b, int ldb, float beta,
                    float* c, int ldc) {
    constexpr int kAlign = 16;  // block edges on whole cache lines of c and whole GEMM tiles
    const bool split_rows = m >= n;
    const int length = split_rows ? m : n;
#pragma omp parallel
    {
        const int threads = omp_get_num_threads();
        const int chunk = ((length + threads - 1) / threads + kAlign - 1) / kAlign * kAlign;
        const int begin = std::min(length, omp_get_thread_num() * chunk);
        const int end = std::min(length, begin + chunk);
        if (end > begin && split_rows) {
            // Rows begin.. of op(a) and of c.
            const float* a_block =
                a + (trans_a == CblasNoTrans ? static_cast<std::size_t>(begin) * lda : begin);
            cblas_sgemm(CblasRowMajor, trans_a, trans_b, end - begin, n, k, alpha, a_block, lda, b,
                        ldb, beta, c + static_cast<std::size_t>(begin) * ldc, ldc);
        } else if (end > begin) {
            // Columns begin.. of op(b) and of c.
            const float* b_block =
                b + (trans_b == CblasNoTrans ? begin : static_cast<std::size_t>(begin) * ldb);
            cblas_sgemm(CblasRowMajor, trans_a, trans_b, m, end - begin, k, alpha, a, lda, b_block,
                        ldb, beta, c + begin, ldc);
        }
    }
}

}  // namespace

// out (N,OC) = inp (N,channels) @ weight (OC,channels)^T + bias (OC). The bias is written first and
// the GEMM accumulates onto it (beta 1), saving a second pass over out.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int channels, int OC) {
    float beta = 0.0f;
    if (bias != nullptr) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            float* row = out + static_cast<std::size_t>(n) * OC;
            for (int o = 0; o < OC; o++) row[o] = bias[o];
        }
        beta = 1.0f;
    }
    parallel_sgemm(CblasNoTrans, CblasTrans, N, OC, channels, 1.0f, inp, channels, weight, channels,
                   beta, out, OC);
}

// dinp (N,channels) += dout (N,OC) @ weight (OC,channels); dweight (OC,channels) += dout^T @ inp
// (N,channels); dbias (OC) += column sums of dout.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int channels, int OC) {
    if (dinp != nullptr) {
        parallel_sgemm(CblasNoTrans, CblasNoTrans, N, channels, OC, 1.0f, dout, OC, weight,
                       channels, 1.0f, dinp, channels);
    }
    if (dweight != nullptr)
        parallel_sgemm(CblasTrans, CblasNoTrans, OC, channels, N, 1.0f, dout, OC, inp, channels,
                       1.0f, dweight, channels);
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

// out (N,OC) += bias (OC), row by row.
void add_bias(float* out, const float* bias, int N, int OC) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float* row = out + static_cast<std::size_t>(n) * OC;
        for (int o = 0; o < OC; o++) row[o] += bias[o];
    }
}

}  // namespace trident::kernels::cpu
