// Measures the GEMM rate used as the CPU's peak (see device_peak.h).
#include "train/device_peak.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "model/gpt.h"

namespace trident::train {

double measure_gemm_flops(kernels::Ops& ops) {
    // Large enough that the rate is the kernel's, not the threads' start-up (at 1024 a
    // 2-core machine measured a third below its 2048 rate).
    constexpr int n = 2048;
    const std::size_t count = static_cast<std::size_t>(n) * n;
    double best = 1e30;
    {
        model::DeviceBuffer a(ops, count), b(ops, count), out(ops, count);
        std::vector<float> values(count);
        for (std::size_t i = 0; i < count; ++i) values[i] = 0.001f * static_cast<float>(i % 97);
        ops.copy_from_host(a.data(), values.data(), count);
        ops.copy_from_host(b.data(), values.data(), count);
        ops.matmul_forward(out.data(), a.data(), b.data(), nullptr, n, n, n);  // warm-up
        for (int rep = 0; rep < 3; ++rep) {
            const auto t0 = std::chrono::steady_clock::now();
            ops.matmul_forward(out.data(), a.data(), b.data(), nullptr, n, n, n);
            const auto t1 = std::chrono::steady_clock::now();
            best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
        }
    }
    ops.reset_peak_allocated_bytes();
    return 2.0 * n * n * n / best;
}

}  // namespace trident::train
