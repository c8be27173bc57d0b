// The host matrix product (see host_gemm.h).
#include "kernels/host_gemm.h"

#include <cblas.h>

namespace trident::kernels {

void host_gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const float* a,
               const float* b, float beta, float* c) {
    cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
                transpose_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, transpose_a ? m : k, b,
                transpose_b ? k : n, beta, c, n);
}

}  // namespace trident::kernels
