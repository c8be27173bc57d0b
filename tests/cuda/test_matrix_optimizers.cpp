// The whole-matrix optimizers' op-set entries on the GPU against the CPU backend's (kernels/ops.h):
// Muon's momentum and step and GaLore's step with fp32 and 16-bit gradients and parameters
// (relative error <= 1e-5 on the fp32 state, backends.h's tolerance on 16-bit outputs), and the
// Newton-Schulz iterations: fp32 (cuBLASLt in true fp32 against OpenBLAS, <= 1e-5) and bf16
// (cuBLASLt's bf16 GEMMs against the CPU's emulated rounding). In bf16 the two sum each product
// in another order, so an element whose fp32 sum straddles a bf16 rounding lands one bf16 ulp
// (2^-8 relative) apart, and the next iterations carry such differences forward as further
// roundings do: backends.h's bf16 tolerance, a few units of bf16's rounding (1e-2). That bf16
// and fp32 themselves differ by more is checked too, so the bf16 comparison cannot pass by
// running in fp32.
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "tests/cuda/backends.h"

using namespace gpu_test;

TEST_CASE("cuda: Muon's momentum and step, GaLore's step, against the CPU", "[ops]") {
    Backends b;
    const std::size_t n = 10007;  // not a multiple of a block
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
        Pair grads(b, n, t), momentum(b, n, DType::f32), u(b, n, DType::f32);
        grads.fill(1, 0.01f);
        momentum.fill(2, 0.01f);
        for (bool nesterov : {true, false}) {
            b.cpu->muon_momentum(u.cpu.f32(), momentum.cpu.f32(), grads.cpu, n, 0.95f, nesterov,
                                 0.7f);
            b.gpu->muon_momentum(u.gpu.f32(), momentum.gpu.f32(), grads.gpu, n, 0.95f, nesterov,
                                 0.7f);
            const std::string form = nesterov ? " (nesterov)" : "";
            require_close(momentum, DType::f32, "muon momentum, " + std::string(name(t)) + form);
            require_close(u, DType::f32, "muon input, " + std::string(name(t)) + form);
        }
        Pair master(b, n, DType::f32), direction(b, n, DType::f32), params(b, n, t);
        master.fill(3, 0.02f);
        direction.fill(4, 0.01f);
        b.cpu->muon_update(master.cpu.f32(), direction.cpu.f32(), n, 3e-3f, 0.1f, params.cpu);
        b.gpu->muon_update(master.gpu.f32(), direction.gpu.f32(), n, 3e-3f, 0.1f, params.gpu);
        require_close(master, DType::f32, "muon step master");
        require_close(params, t, "muon step params");
        b.cpu->galore_update(master.cpu.f32(), direction.cpu.f32(), n, 3e-3f, 0.1f, params.cpu);
        b.gpu->galore_update(master.gpu.f32(), direction.gpu.f32(), n, 3e-3f, 0.1f, params.gpu);
        require_close(master, DType::f32, "galore step master");
        require_close(params, t, "galore step params");
        // Without a rounded copy of the parameters.
        b.cpu->muon_update(master.cpu.f32(), direction.cpu.f32(), n, 3e-3f, 0.1f, Ptr{});
        b.gpu->muon_update(master.gpu.f32(), direction.gpu.f32(), n, 3e-3f, 0.1f, Ptr{});
        require_close(master, DType::f32, "muon step master, no params");
    }
}

TEST_CASE("cuda: Muon's Newton-Schulz iterations in fp32 and bf16 against the CPU", "[ops]") {
    Backends b;
    // (rows, cols), rows <= cols: a wide matrix, a square one, one whose sides are no tile's.
    for (auto [rows, cols] : {std::pair{64, 256}, std::pair{96, 96}, std::pair{37, 129}}) {
        const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
        Pair x(b, n, DType::f32);
        Pair scratch(b, trident::kernels::newton_schulz_scratch(rows, cols), DType::f32);
        x.fill(5 + static_cast<uint64_t>(rows));
        // Normalised as Muon's step does: U / ‖U‖_F.
        std::vector<float> u = x.on_cpu();
        double sum = 0;
        for (float e : u) sum += static_cast<double>(e) * e;
        for (float& e : u) e = static_cast<float>(e / std::sqrt(sum));
        const std::string shape = std::to_string(rows) + "x" + std::to_string(cols);
        std::vector<float> fp32_cpu;
        for (DType precision : {DType::f32, DType::bf16}) {
            x.set(u);
            b.cpu->newton_schulz(x.cpu.f32(), scratch.cpu.f32(), rows, cols, 5, precision);
            b.gpu->newton_schulz(x.gpu.f32(), scratch.gpu.f32(), rows, cols, 5, precision);
            require_close(x, precision, "newton-schulz " + shape);
            if (precision == DType::f32) {
                fp32_cpu = x.on_cpu();
                continue;
            }
            const double apart = relative_error(x.on_cpu(), fp32_cpu);
            INFO("bf16 against fp32 on the CPU: " << apart);
            REQUIRE(apart > 10 * tolerance(DType::f32));
        }
    }
}
