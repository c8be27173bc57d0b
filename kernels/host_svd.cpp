// The host SVD and its sign convention (see host_svd.h).
#include "kernels/host_svd.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>

#include "kernels/error.h"

// LAPACK's Fortran entry point (OpenBLAS exports it; LAPACKE, its C API, is not installed).
extern "C" void sgesdd_(const char* jobz, const int* m, const int* n, float* a, const int* lda,
                        float* s, float* u, const int* ldu, float* vt, const int* ldvt, float* work,
                        const int* lwork, int* iwork, int* info, std::size_t jobz_length);

namespace trident::kernels {

namespace {

std::size_t size(int n) {
    return static_cast<std::size_t>(n);
}

// The index of the component of largest magnitude among `count` at `x`, `stride` apart.
int largest(const float* x, int count, int stride) {
    int best = 0;
    for (int i = 1; i < count; ++i)
        if (std::fabs(x[size(i * stride)]) > std::fabs(x[size(best * stride)])) best = i;
    return best;
}

}  // namespace

Svd host_svd(std::vector<float>& a, int m, int n) {
    // Row-major a (m, n) is column-major aᵀ (n, m) = V·S·Uᵀ: LAPACK's left vectors of aᵀ,
    // column-major (n, k), are vt row-major (k, n), and its right ones u (m, k).
    const int k = std::min(m, n);
    Svd r{std::vector<float>(size(m) * size(k)), std::vector<float>(size(k)),
          std::vector<float>(size(k) * size(n))};
    std::vector<int> iwork(8 * size(k));
    int info = 0, query = -1;
    float optimal = 0;
    sgesdd_("S", &n, &m, a.data(), &n, r.s.data(), r.vt.data(), &n, r.u.data(), &k, &optimal,
            &query, iwork.data(), &info, 1);
    const int lwork = static_cast<int>(optimal);
    std::vector<float> work(size(std::max(lwork, 1)));
    if (info == 0)
        sgesdd_("S", &n, &m, a.data(), &n, r.s.data(), r.vt.data(), &n, r.u.data(), &k, work.data(),
                &lwork, iwork.data(), &info, 1);
    if (info != 0)
        throw Error("sgesdd failed on a " + std::to_string(m) + "x" + std::to_string(n) +
                    " matrix (info " + std::to_string(info) + ")");
    return r;
}

void fix_column_signs(std::vector<float>& u, int m, int k) {
    for (int j = 0; j < k; ++j) {
        if (u[size(largest(u.data() + j, m, k) * k + j)] >= 0) continue;
        for (int i = 0; i < m; ++i) u[size(i * k + j)] = -u[size(i * k + j)];
    }
}

void fix_row_signs(std::vector<float>& vt, int k, int n) {
    for (int i = 0; i < k; ++i) {
        float* row = vt.data() + size(i) * size(n);
        if (row[largest(row, n, 1)] >= 0) continue;
        for (int j = 0; j < n; ++j) row[j] = -row[j];
    }
}

}  // namespace trident::kernels
