// The CPU backend's grouped linear (Ops::grouped_matmul_forward and _backward, a mixture of
// experts' GEMMs) against one matmul_forward or matmul_backward per group, bit for bit, in
// fp32 and bf16, with an empty group among them; and in fp32 against a plain loop in double
// precision, the formulas of kernels/ops.h written out.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/device_buffer.h"
#include "kernels/ops.h"
#include "kernels/random.h"

using namespace trident::kernels;

namespace {

constexpr int kChannels = 24, kOC = 40, kGroups = 4;
// Group 1 is empty; the others' row counts are not multiples of a GEMM tile.
const std::vector<int32_t> kOffsets = {0, 5, 5, 18, 25};
constexpr std::size_t kRows = 25;

// A buffer of `count` normal(0, 1) values rounded to `dtype`.
DeviceBuffer random_buffer(Ops& ops, std::size_t count, DType dtype, uint64_t seed) {
    DeviceBuffer b(ops, count, dtype);
    std::vector<float> values(count);
    for (std::size_t i = 0; i < count; ++i) values[i] = static_cast<float>(normal(seed, i));
    ops.copy_from_host(b.data(), values.data(), count);
    return b;
}

std::vector<float> host(Ops& ops, const DeviceBuffer& b, std::size_t count) {
    std::vector<float> values(count);
    ops.copy_to_host(values.data(), b.data(), count);
    return values;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ||a - b|| / ||b||.
double relative_error(const std::vector<float>& a, const std::vector<double>& b) {
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        diff += (a[i] - b[i]) * (a[i] - b[i]);
        norm += b[i] * b[i];
    }
    return std::sqrt(diff / norm);
}

// The inputs of one problem, and the outputs and gradients it starts from (not zero: the
// backward adds).
struct Problem {
    DeviceBuffer inp, dout, dinp;
    std::vector<DeviceBuffer> weights, dweights;

    Problem(Ops& ops, DType t)
        : inp(random_buffer(ops, kRows * kChannels, t, 1)),
          dout(random_buffer(ops, kRows * kOC, t, 2)),
          dinp(random_buffer(ops, kRows * kChannels, t, 3)) {
        for (uint64_t g = 0; g < kGroups; ++g) {
            weights.push_back(random_buffer(ops, kOC * kChannels, t, 10 + g));
            dweights.push_back(random_buffer(ops, kOC * kChannels, t, 20 + g));
        }
    }
    std::vector<ConstPtr> weight_ptrs() const {
        std::vector<ConstPtr> p;
        for (const DeviceBuffer& w : weights) p.push_back(w.data());
        return p;
    }
    std::vector<Ptr> dweight_ptrs() const {
        std::vector<Ptr> p;
        for (const DeviceBuffer& w : dweights) p.push_back(w.data());
        return p;
    }
};

// What a problem's grouped ops leave: out, dinp and each group's dweight, as fp32 on the host.
struct Results {
    std::vector<float> out, dinp;
    std::vector<std::vector<float>> dweights;
};

Results grouped(Ops& ops, DType t) {
    Problem p(ops, t);
    const DeviceBuffer out(ops, kRows * kOC, t);
    ops.grouped_matmul_forward(out.data(), p.inp.data(), p.weight_ptrs().data(), kOffsets.data(),
                               kGroups, kChannels, kOC);
    ops.grouped_matmul_backward(p.dinp.data(), p.dweight_ptrs().data(), p.dout.data(), p.inp.data(),
                                p.weight_ptrs().data(), kOffsets.data(), kGroups, kChannels, kOC);
    Results r{host(ops, out, kRows * kOC), host(ops, p.dinp, kRows * kChannels), {}};
    for (const DeviceBuffer& w : p.dweights) r.dweights.push_back(host(ops, w, kOC * kChannels));
    return r;
}

// The same through matmul_forward and matmul_backward on each non-empty group's rows.
Results per_group(Ops& ops, DType t) {
    Problem p(ops, t);
    const DeviceBuffer out(ops, kRows * kOC, t);
    for (std::size_t g = 0; g < kGroups; ++g) {
        const std::size_t first = static_cast<std::size_t>(kOffsets[g]);
        const int rows = kOffsets[g + 1] - kOffsets[g];
        if (rows == 0) continue;
        ops.matmul_forward(out.data() + first * kOC, p.inp.data() + first * kChannels,
                           p.weights[g].data(), nullptr, rows, kChannels, kOC);
        ops.matmul_backward(p.dinp.data() + first * kChannels, p.dweights[g].data(), nullptr,
                            p.dout.data() + first * kOC, p.inp.data() + first * kChannels,
                            p.weights[g].data(), rows, kChannels, kOC);
    }
    Results r{host(ops, out, kRows * kOC), host(ops, p.dinp, kRows * kChannels), {}};
    for (const DeviceBuffer& w : p.dweights) r.dweights.push_back(host(ops, w, kOC * kChannels));
    return r;
}

}  // namespace

TEST_CASE("grouped matmul: bit for bit one matmul per group, on the CPU", "[grouped-matmul]") {
    const std::unique_ptr<Ops> ops = make_cpu_ops(2);
    for (const DType t : {DType::f32, DType::bf16}) {
        INFO(name_of(t));
        const Results got = grouped(*ops, t), want = per_group(*ops, t);
        CHECK(bitwise_equal(got.out, want.out));
        CHECK(bitwise_equal(got.dinp, want.dinp));
        for (std::size_t g = 0; g < kGroups; ++g)
            CHECK(bitwise_equal(got.dweights[g], want.dweights[g]));
    }
}

TEST_CASE("grouped matmul: the formulas, in double precision", "[grouped-matmul]") {
    const std::unique_ptr<Ops> ops = make_cpu_ops(2);
    const Results got = grouped(*ops, DType::f32);
    Problem p(*ops, DType::f32);  // the same values again
    const std::vector<float> inp = host(*ops, p.inp, kRows * kChannels),
                             dout = host(*ops, p.dout, kRows * kOC),
                             dinp0 = host(*ops, p.dinp, kRows * kChannels);
    std::vector<double> out(kRows * kOC, 0.0), dinp(dinp0.begin(), dinp0.end());
    for (std::size_t g = 0; g < kGroups; ++g) {
        const std::vector<float> w = host(*ops, p.weights[g], kOC * kChannels),
                                 dw0 = host(*ops, p.dweights[g], kOC * kChannels);
        std::vector<double> dw(dw0.begin(), dw0.end());
        for (int n = kOffsets[g]; n < kOffsets[g + 1]; ++n)
            for (int o = 0; o < kOC; ++o)
                for (int c = 0; c < kChannels; ++c) {
                    const std::size_t x = static_cast<std::size_t>(n) * kChannels + c,
                                      y = static_cast<std::size_t>(n) * kOC + o,
                                      wi = static_cast<std::size_t>(o) * kChannels + c;
                    out[y] += static_cast<double>(inp[x]) * w[wi];    // out = inp W^T
                    dinp[x] += static_cast<double>(dout[y]) * w[wi];  // dinp += dout W
                    dw[wi] += static_cast<double>(dout[y]) * inp[x];  // dW += dout^T inp
                }
        INFO("group " << g);
        CHECK(relative_error(got.dweights[g], dw) < 1e-6);
    }
    CHECK(relative_error(got.out, out) < 1e-6);
    CHECK(relative_error(got.dinp, dinp) < 1e-6);
}
