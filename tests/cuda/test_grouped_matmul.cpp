// The GPU's grouped linear (Ops::grouped_matmul_forward and _backward: cuBLAS's grouped GEMM,
// kernels/cuda/grouped_gemm.h) against the CPU backend's, one matmul per group: fp32 (relative
// error <= 1e-5), bf16 and fp16 (backends.h), groups of uneven sizes and an empty one, the
// backward's input and weight gradients separately and together (+=); and 16-bit weights with
// fp32 gradients, the mix the grouped product lacks (group by group).
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "tests/cuda/backends.h"

using namespace gpu_test;

namespace {

constexpr int kChannels = 96, kOC = 160, kGroups = 5;
// Group 2 is empty; the row counts are not multiples of a GEMM tile.
const std::vector<int32_t> kOffsets = {0, 37, 100, 100, 131, 230};
constexpr std::size_t kRows = 230;

// One weight per group on both backends, of `t`, filled from `seed`.
std::vector<std::unique_ptr<Pair>> per_group(Backends& b, DType t, uint64_t seed, float scale) {
    std::vector<std::unique_ptr<Pair>> pairs;
    for (int g = 0; g < kGroups; ++g) {
        pairs.push_back(std::make_unique<Pair>(b, std::size_t(kOC) * kChannels, t));
        pairs.back()->fill(seed + static_cast<uint64_t>(g), scale);
    }
    return pairs;
}

template <typename P>
std::vector<P> pointers(const std::vector<std::unique_ptr<Pair>>& pairs, bool gpu) {
    std::vector<P> p;
    for (const auto& pair : pairs) p.push_back(gpu ? pair->gpu : pair->cpu);
    return p;
}

// The grouped ops on one backend: forward, then the backward's input gradient alone, weight
// gradient alone, or both in one call.
void run(Ops& ops, bool gpu, Pair& out, Pair& inp, Pair& dout, Pair& dinp,
         const std::vector<std::unique_ptr<Pair>>& weights,
         const std::vector<std::unique_ptr<Pair>>& dweights, int part) {
    const std::vector<ConstPtr> w = pointers<ConstPtr>(weights, gpu);
    const std::vector<Ptr> dw = pointers<Ptr>(dweights, gpu);
    const auto at = [gpu](const Pair& p) { return gpu ? p.gpu : p.cpu; };
    ops.grouped_matmul_forward(at(out), at(inp), w.data(), kOffsets.data(), kGroups, kChannels,
                               kOC);
    ops.grouped_matmul_backward(part == 1 ? Ptr() : at(dinp), part == 0 ? nullptr : dw.data(),
                                at(dout), at(inp), w.data(), kOffsets.data(), kGroups, kChannels,
                                kOC);
}

}  // namespace

TEST_CASE("cuda: grouped matmul against the CPU's, one matmul per group", "[ops]") {
    Backends b;
    const struct {
        DType act, weight, grad;
    } mixes[] = {{DType::f32, DType::f32, DType::f32},
                 {DType::bf16, DType::bf16, DType::bf16},
                 {DType::f16, DType::f16, DType::f16},
                 {DType::bf16, DType::bf16, DType::f32}};
    for (const auto& m : mixes)
        for (int part : {0, 1, 2}) {  // input gradient, weight gradient, both
            const std::string what = std::string(name(m.act)) + " activations, " + name(m.weight) +
                                     " weights, " + name(m.grad) + " gradients, part " +
                                     std::to_string(part);
            INFO(what);
            Pair out(b, kRows * kOC, m.act), inp(b, kRows * kChannels, m.act),
                dout(b, kRows * kOC, m.act), dinp(b, kRows * kChannels, m.act);
            inp.fill(1);
            dout.fill(2, 0.1f);
            dinp.fill(3, 0.5f);  // the backward adds
            const auto weights = per_group(b, m.weight, 10, 0.1f);
            const auto dweights = per_group(b, m.grad, 20, 0.5f);
            run(*b.cpu, false, out, inp, dout, dinp, weights, dweights, part);
            run(*b.gpu, true, out, inp, dout, dinp, weights, dweights, part);
            require_close(out, m.act, "grouped forward, " + what);
            if (part != 1) require_close(dinp, m.act, "grouped input gradient, " + what);
            for (int g = 0; g < kGroups && part != 0; ++g)
                require_close(
                    *dweights[static_cast<std::size_t>(g)], m.grad,
                    "grouped weight gradient of group " + std::to_string(g) + ", " + what);
        }
}
