// The peak FLOP rate MFU is against: measured, or a GPU's datasheet figure (see device_peak.h).
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
        kernels::DeviceBuffer a(ops, count), b(ops, count), out(ops, count);
        std::vector<float> values(count);
        for (std::size_t i = 0; i < count; ++i) values[i] = 0.001f * static_cast<float>(i % 97);
        ops.copy_from_host(a.data(), values.data(), count);
        ops.copy_from_host(b.data(), values.data(), count);
        // A GPU backend queues the product and returns: reading one element back waits for it.
        float first = 0.0f;
        ops.matmul_forward(out.data(), a.data(), b.data(), nullptr, n, n, n);  // warm-up
        ops.copy_to_host(&first, out.data(), 1);
        for (int rep = 0; rep < 3; ++rep) {
            const auto t0 = std::chrono::steady_clock::now();
            ops.matmul_forward(out.data(), a.data(), b.data(), nullptr, n, n, n);
            ops.copy_to_host(&first, out.data(), 1);
            const auto t1 = std::chrono::steady_clock::now();
            best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
        }
    }
    ops.reset_peak_allocated_bytes();
    return 2.0 * n * n * n / best;
}

double datasheet_peak_flops(const std::string& gpu_name) {
    const auto has = [&](const char* part) { return gpu_name.find(part) != std::string::npos; };
    if (has("H100") && has("PCIe")) return 756e12;
    if (has("H100") || has("H200") || has("GH200")) return 989e12;
    if (has("A100")) return 312e12;
    return 0.0;
}

}  // namespace trident::train
