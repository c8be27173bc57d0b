// The thin singular value decomposition of a single-precision matrix in host memory (OpenBLAS's
// LAPACK, sgesdd: divide and conquer, the routine torch.linalg.svd calls on the CPU), for the
// optimizer's whole-matrix steps (GaLore's projectors, optim/galore.h).
#pragma once

#include <vector>

namespace trident::kernels {

// a (m, n) row-major = u · diag(s) · vt, k = min(m, n): u (m, k), s (k) descending, vt (k, n),
// row-major. `a` is overwritten. Throws Error when LAPACK reports a failure.
struct Svd {
    std::vector<float> u, s, vt;
};
Svd host_svd(std::vector<float>& a, int m, int n);

// Each singular vector's sign chosen so that its component of largest magnitude is positive
// (the lowest index on a tie): the columns of u (m, k), or the rows of vt (k, n). LAPACK leaves
// the sign to its implementation; fixing it makes the result the same on every machine.
void fix_column_signs(std::vector<float>& u, int m, int k);
void fix_row_signs(std::vector<float>& vt, int k, int n);

}  // namespace trident::kernels
