// A single-precision matrix product on host memory (OpenBLAS), for the optimizer's
// whole-matrix steps (Muon's Newton-Schulz iterations, optim/muon.h), which run on matrices
// assembled in host memory rather than through the op set's kernels.
#pragma once

namespace trident::kernels {

// c (m, n) = alpha · op(a) · op(b) + beta · c, row-major: op(a) (m, k) is a or, transposed,
// aᵀ of a (k, m); op(b) (k, n) likewise.
void host_gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const float* a,
               const float* b, float beta, float* c);

}  // namespace trident::kernels
