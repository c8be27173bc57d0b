// Measures the GEMM rate used as the CPU's peak (see device_peak.h).
#include "train/device_peak.h"

#include <algorithm>
#include <chrono>

#include "model/gpt.h"

namespace trident::train {

double measure_gemm_flops(kernels::Ops& ops) {
    constexpr int n = 1024;
    const std::size_t count = static_cast<std::size_t>(n) * n;
    model::DeviceBuffer a(ops, count), b(ops, count), out(ops, count);
    ops.matmul_forward(out.data(), a.data(), b.data(), nullptr, n, n, n);  // warm-up
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        ops.matmul_forward(out.data(), a.data(), b.data(), nullptr, n, n, n);
        const auto t1 = std::chrono::steady_clock::now();
        best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
    }
    return 2.0 * n * n * n / best;
}

}  // namespace trident::train
