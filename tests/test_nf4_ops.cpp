// The CPU backend's NF4 dequantization (Ops::nf4_dequantize) against the host reference
// (kernels::nf4_dequantize), element by element: whole matrices and the shards a row split and
// a column split leave a tensor rank, with and without double quantization, into fp32, bf16
// and fp16 tiles; and a shard's blocks dequantize to the whole matrix's at the places its map
// gives (kernels/nf4_format.h). The store (kernels/nf4_store.h) places matrices in groups padded
// to a multiple, each group's bytes read where they are (as a gathered unit's are).
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/device_buffer.h"
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

// The shape of `m`, a shard of a matrix of `whole` elements (or the whole).
Nf4Shape shape_of(const Nf4Tensor& m, std::size_t whole) {
    return Nf4Shape{m.size, whole, m.block, m.double_quant(), m.map};
}

// The op's output for matrix i of `store`, its group's bytes at `group`, in `dtype`, widened to
// fp32 on the host.
std::vector<float> op_dequantized(Ops& ops, const Nf4Store& store, std::size_t i,
                                  const DeviceBuffer& group, DType dtype) {
    const std::size_t count = store.shape(i).count;
    const DeviceBuffer out(ops, count, dtype);
    ops.nf4_dequantize(out.data(), store.view(i, static_cast<const uint8_t*>(group.data().data)));
    std::vector<float> host(count);
    ops.copy_to_host(host.data(), out.data(), count);
    return host;
}

// The bytes of `store`'s group g in a device buffer of their own.
DeviceBuffer upload_group(Ops& ops, const Nf4Store& store, const std::vector<uint8_t>& bytes,
                          std::size_t g) {
    const auto [begin, end] = store.groups()[g];
    DeviceBuffer group(ops, end - begin, DType::u8);
    ops.upload(group.data().data, bytes.data() + begin, end - begin);
    return group;
}

// The op's output for `m` alone, in one group of exactly the format's bytes.
std::vector<float> op_dequantized(Ops& ops, const Nf4Tensor& m, std::size_t whole, DType dtype) {
    const Nf4Store store({{shape_of(m, whole)}}, 1);
    REQUIRE(store.bytes() == m.bytes());
    return op_dequantized(ops, store, 0, upload_group(ops, store, store.pack(std::span(&m, 1)), 0),
                          dtype);
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
                CHECK(bitwise_equal(op_dequantized(*ops, *m, w.size(), dtype), rounded));
            }
        }
    }
}

TEST_CASE("nf4: the store's groups, padded, read where their bytes are", "[nf4]") {
    const std::unique_ptr<Ops> ops = make_cpu_ops(2);
    const std::vector<float> w = random_matrix(3);
    const std::size_t half = kCols / 2 / kBlock, whole_row = kCols / kBlock;
    for (const bool double_quant : {true, false}) {
        INFO("double quantization " << double_quant);
        const Nf4Tensor whole = nf4_quantize(w, kBlock, double_quant);
        const std::vector<Nf4Tensor> matrices = {
            whole, nf4_shard(whole, {half, whole_row, half}, kRows * half),
            nf4_shard(whole, {SIZE_MAX, 0, kRows / 2 * whole_row}, kRows / 2 * whole_row)};
        // Groups {0, 1} and {2}, each padded to a multiple of 3 bytes (a unit over 3 ranks).
        const Nf4Store store({{shape_of(matrices[0], w.size()), shape_of(matrices[1], w.size())},
                              {shape_of(matrices[2], w.size())}},
                             3);
        const std::size_t first = matrices[0].bytes() + matrices[1].bytes();
        const std::size_t padded = (first + 2) / 3 * 3;
        CHECK(store.groups()[0] == std::pair<std::size_t, std::size_t>{0, padded});
        CHECK(store.groups()[1].first == padded);
        CHECK(store.groups()[1].second - padded == (matrices[2].bytes() + 2) / 3 * 3);
        const std::vector<uint8_t> bytes = store.pack(matrices);
        REQUIRE(bytes.size() == store.bytes());
        for (std::size_t i = 0; i < matrices.size(); ++i) {
            INFO("matrix " << i);
            CHECK(store.group_of(i) == (i < 2 ? 0u : 1u));
            const DeviceBuffer group = upload_group(*ops, store, bytes, store.group_of(i));
            CHECK(bitwise_equal(op_dequantized(*ops, store, i, group, DType::f32),
                                op_dequantized(*ops, matrices[i], w.size(), DType::f32)));
        }
    }
}
