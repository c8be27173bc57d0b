// The CPU backend's NF4 dequantization (Ops::nf4_dequantize) against the host reference
// (kernels::nf4_dequantize), element by element: whole matrices and the shards a row split and
// a column split leave a tensor rank, with and without double quantization, into fp32, bf16
// and fp16 tiles; and a shard's blocks dequantize to the whole matrix's at the places its map
// gives (kernels/nf4_format.h).
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/nf4.h"
#include "kernels/nf4_store.h"
#include "kernels/ops.h"
#include "kernels/random.h"

using namespace trident::kernels;

namespace {

constexpr std::size_t kRows = 40, kCols = 512, kBlock = 16;

std::vector<float> random_matrix(uint64_t seed) {
    std::vector<float> w(kRows * kCols);
    for (std::size_t i = 0; i < w.size(); ++i)
        w[i] = static_cast<float>(normal(seed, i)) * (i % 7 == 0 ? 0.5f : 0.02f);
    return w;
}

// The op's output for `m`, in `dtype`, widened to fp32 on the host.
std::vector<float> op_dequantized(Ops& ops, const Nf4Tensor& m, DType dtype) {
    const Nf4Store store(ops, std::span(&m, 1));
    REQUIRE(store.bytes() == m.bytes());
    const DeviceBuffer out(ops, m.size, dtype);
    ops.nf4_dequantize(out.data(), store[0]);
    std::vector<float> host(m.size);
    ops.copy_to_host(host.data(), out.data(), m.size);
    return host;
}

// Whether a and b hold the same bits, element by element.
bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("nf4: the CPU op dequantizes bit for bit as the reference, whole and sharded", "[nf4]") {
    const std::unique_ptr<Ops> ops = make_cpu_ops(2);
    const std::vector<float> w = random_matrix(7);
    const std::size_t half = kCols / 2 / kBlock, whole_row = kCols / kBlock;
    for (const bool double_quant : {true, false}) {
        const Nf4Tensor whole = nf4_quantize(w, kBlock, double_quant);
        std::vector<float> reference(whole.size);
        nf4_dequantize(whole, reference);
        // Tensor rank 1 of 2: the right half of each row (a row split), then the second half of
        // the rows (a column split).
        const Nf4Tensor row_split = nf4_shard(whole, {half, whole_row, half}, kRows * half);
        const Nf4Tensor column_split =
            nf4_shard(whole, {SIZE_MAX, 0, kRows / 2 * whole_row}, kRows / 2 * whole_row);
        for (const Nf4Tensor* m : {&whole, &row_split, &column_split}) {
            INFO("double quantization " << double_quant << ", " << m->size << " elements");
            std::vector<float> want(m->size);
            nf4_dequantize(*m, want);
            for (std::size_t b = 0; b < m->blocks(); ++b)
                for (std::size_t i = 0; i < kBlock; ++i)
                    REQUIRE(want[b * kBlock + i] == reference[m->map.whole(b) * kBlock + i]);
            for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
                INFO(name_of(dtype));
                std::vector<float> rounded = want;
                for (float& v : rounded) v = round_to(dtype, v);
                CHECK(bitwise_equal(op_dequantized(*ops, *m, dtype), rounded));
            }
        }
    }
}
