// The 4-bit base's dequantization on the GPU (Ops::nf4_dequantize, kernels/cuda/nf4.cu)
// against the CPU backend's, element by element (bit for bit): a whole matrix, and the shards
// a row split and a column split leave tensor rank 1 of 4, with and without double
// quantization, into fp32, bf16 and fp16 tiles.
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "kernels/device_buffer.h"
#include "kernels/nf4.h"
#include "kernels/nf4_store.h"
#include "tests/cuda/backends.h"

using namespace gpu_test;
using trident::kernels::Nf4Store;
using trident::kernels::Nf4Tensor;

namespace {

constexpr std::size_t kRows = 96, kCols = 4096, kBlock = 64;

// `m` (a shard of a matrix of `whole` elements) uploaded to `ops` as the store lays it out and
// dequantized there into `dtype`, widened to fp32 on the host.
std::vector<float> dequantized(Ops& ops, const Nf4Tensor& m, std::size_t whole, DType dtype) {
    const Nf4Store store(
        {{trident::kernels::Nf4Shape{m.size, whole, m.block, m.double_quant(), m.map}}}, 1);
    const std::vector<uint8_t> bytes = store.pack(std::span(&m, 1));
    const trident::kernels::DeviceBuffer codes(ops, bytes.size(), DType::u8);
    ops.upload(codes.data().data, bytes.data(), bytes.size());
    const trident::kernels::DeviceBuffer out(ops, m.size, dtype);
    ops.nf4_dequantize(out.data(), store.view(0, static_cast<const uint8_t*>(codes.data().data)));
    return Pair::host(ops, out.data(), m.size);
}

}  // namespace

TEST_CASE("cuda: NF4 dequantization, bit for bit the CPU's", "[ops]") {
    Backends b;
    std::vector<float> w(kRows * kCols);
    for (std::size_t i = 0; i < w.size(); ++i)
        w[i] = static_cast<float>(trident::kernels::normal(11, i)) * (i % 5 ? 0.02f : 0.3f);
    const std::size_t row = kCols / kBlock, quarter = row / 4;
    for (const bool double_quant : {true, false}) {
        const Nf4Tensor whole = trident::kernels::nf4_quantize(w, kBlock, double_quant);
        const Nf4Tensor shards[] = {
            whole, trident::kernels::nf4_shard(whole, {quarter, row, quarter}, kRows * quarter),
            trident::kernels::nf4_shard(whole, {SIZE_MAX, 0, kRows / 4 * row}, kRows / 4 * row)};
        for (const Nf4Tensor& m : shards)
            for (const DType t : {DType::f32, DType::bf16, DType::f16}) {
                const std::vector<float> gpu = dequantized(*b.gpu, m, w.size(), t);
                const std::vector<float> cpu = dequantized(*b.cpu, m, w.size(), t);
                std::printf(
                    "compared: nf4_dequantize of %zu elements (%s, double quantization "
                    "%d): relative error %.3e (bit for bit)\n",
                    m.size, name(t), double_quant, relative_error(gpu, cpu));
                INFO(m.size << " elements, " << name(t) << ", double quantization "
                            << double_quant);
                REQUIRE(std::memcmp(gpu.data(), cpu.data(), gpu.size() * sizeof(float)) == 0);
            }
    }
}
