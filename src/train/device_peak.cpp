// The peak FLOP rate MFU is against: measured, or a GPU's datasheet figure (see device_peak.h).
#include "train/device_peak.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <vector>

#include "model/gpt.h"

namespace trident::train {

namespace {

// An n x n x n product on square matrices the backend holds, ready to time.
class GemmProbe {
public:
    GemmProbe(kernels::Ops& ops, int n)
        : ops_(ops), n_(n), a_(ops, count()), b_(ops, count()), out_(ops, count()) {
        std::vector<float> values(count());
        for (std::size_t i = 0; i < values.size(); ++i)
            values[i] = 0.001f * static_cast<float>(i % 97);
        ops.copy_from_host(a_.data(), values.data(), values.size());
        ops.copy_from_host(b_.data(), values.data(), values.size());
        seconds();  // warm-up
    }

    // Seconds of one product (a GPU backend queues it and returns: reading one element back
    // waits for it).
    double seconds() {
        float first = 0.0f;
        const auto t0 = std::chrono::steady_clock::now();
        ops_.matmul_forward(out_.data(), a_.data(), b_.data(), nullptr, n_, n_, n_);
        ops_.copy_to_host(&first, out_.data(), 1);
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }

    int size() const { return n_; }

private:
    std::size_t count() const { return static_cast<std::size_t>(n_) * n_; }

    kernels::Ops& ops_;
    int n_;
    kernels::DeviceBuffer a_, b_, out_;
};

}  // namespace

double measure_gemm_flops(kernels::Ops& ops) {
    // Sized to the machine: the smallest n (from 512, doubling up to 4096) whose product takes
    // kMinSeconds, so that the rate is the kernel's and not the threads' start-up (a 2-core
    // machine measured a third below its 2048 rate when timing 1024 on both cores).
    constexpr double kMinSeconds = 0.02, kBudgetSeconds = 0.3;
    constexpr int kMinRepeats = 3, kMaxRepeats = 10;
    std::optional<GemmProbe> probe;
    double best = 0;
    for (int n = 512;; n *= 2) {
        probe.emplace(ops, n);
        best = probe->seconds();
        if (best >= kMinSeconds || n == 4096) break;
    }
    // Then the best of several: on a machine other work shares, the fastest repeat is the one
    // the others disturbed least.
    double spent = best;
    for (int rep = 1; rep < kMaxRepeats && (rep < kMinRepeats || spent < kBudgetSeconds); ++rep) {
        const double s = probe->seconds();
        best = std::min(best, s);
        spent += s;
    }
    const double n = probe->size();
    probe.reset();
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
