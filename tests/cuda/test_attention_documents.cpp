// Attention within documents on the GPU (kernels/ops.h, document_attention_forward, _backward
// and _rebuild; the flash kernels with each row's document start) against the CPU backend's:
// documents shorter than a tile, longer than a thread block, of one row, and crossing tile
// boundaries beside one document the length of the window, for head sizes that take each thread
// layout of the fp32 kernels and each tile width of the tensor-core ones, in fp32, bf16 and
// fp16, with and without dropout; the rebuilt statistics bit for bit the forward's; and ring
// attention's blocks with their query rows' document starts (AttentionBlock::q_starts).
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/device_buffer.h"
#include "tests/cuda/backends.h"

using namespace gpu_test;
using trident::kernels::AttentionBlock;
using trident::kernels::DeviceBuffer;

namespace {

const DType kTypes[] = {DType::f32, DType::bf16, DType::f16};

// Each row's document's first row (B·T), the sequences cut into documents of `lengths` each.
std::vector<int32_t> document_starts(const std::vector<std::vector<int>>& lengths) {
    std::vector<int32_t> starts;
    for (const std::vector<int>& sequence : lengths) {
        int first = 0;
        for (int n : sequence) {
            starts.insert(starts.end(), static_cast<std::size_t>(n), first);
            first += n;
        }
    }
    return starts;
}

// What a forward keeps on each backend (their own forms: probabilities on the CPU, lse on the
// GPU).
struct Saved {
    DeviceBuffer cpu, gpu;
    Saved(Backends& b, int B, int NH, int T, DType t) {
        const auto c = b.cpu->attention_saved(B, NH, T, t), g = b.gpu->attention_saved(B, NH, T, t);
        cpu = DeviceBuffer(*b.cpu, c.count, c.dtype);
        gpu = DeviceBuffer(*b.gpu, g.count, g.dtype);
    }
};

}  // namespace

TEST_CASE("cuda: attention within documents against the CPU", "[attention]") {
    Backends b;
    const int B = 2, T = 200, NH = 2;
    // Sequence 0: documents of 5, 70, 1, 60 and 64 rows; sequence 1: one of the whole window.
    const Tokens starts(b, document_starts({{5, 70, 1, 60, 64}, {200}}));
    for (const int hs : {16, 40, 64, 128})
        for (const DType t : kTypes)
            for (const float drop : {0.0f, 0.1f}) {
                INFO(name(t) << ", hs " << hs << ", dropout " << drop);
                const int channels = NH * hs;
                const std::size_t BTC = std::size_t(B) * T * channels;
                Pair qkv(b, 3 * BTC, t), out(b, BTC, t), dout(b, BTC, t), dqkv(b, 3 * BTC, t);
                qkv.fill(3);
                dout.fill(4);
                Saved saved(b, B, NH, T, t);
                b.cpu->document_attention_forward(out.cpu, saved.cpu.data(), qkv.cpu,
                                                  starts.on_cpu(), B, T, channels, NH, drop, 7, 1,
                                                  2 * NH);
                b.gpu->document_attention_forward(out.gpu, saved.gpu.data(), qkv.gpu,
                                                  starts.on_gpu(), B, T, channels, NH, drop, 7, 1,
                                                  2 * NH);
                require_close(out, t, "document_attention_forward out");
                b.cpu->document_attention_backward(dqkv.cpu, dout.cpu, qkv.cpu, out.cpu,
                                                   saved.cpu.data(), starts.on_cpu(), B, T,
                                                   channels, NH, drop, 7, 1, 2 * NH);
                b.gpu->document_attention_backward(dqkv.gpu, dout.gpu, qkv.gpu, out.gpu,
                                                   saved.gpu.data(), starts.on_gpu(), B, T,
                                                   channels, NH, drop, 7, 1, 2 * NH);
                require_close(dqkv, t, "document_attention_backward dqkv");
                // Selective recompute's statistics: the forward's, element by element.
                const DeviceBuffer rebuilt(*b.gpu, saved.gpu.size(), saved.gpu.data().dtype);
                b.gpu->document_attention_rebuild(rebuilt.data(), qkv.gpu, starts.on_gpu(), B, T,
                                                  channels, NH, drop);
                const std::vector<float> kept =
                    Pair::host(*b.gpu, saved.gpu.data(), saved.gpu.size());
                const std::vector<float> again = Pair::host(*b.gpu, rebuilt.data(), rebuilt.size());
                REQUIRE(std::memcmp(kept.data(), again.data(), kept.size() * sizeof(float)) == 0);
            }
}

TEST_CASE("cuda: ring attention's blocks within documents against the CPU", "[ring]") {
    Backends b;
    const int B = 2, NH = 2, hs = 64, rows = 130, channels = NH * hs;
    // The query rows sit at positions 200.. of a 400-token window and the keys at 100..: the
    // documents start at positions 0, 150, 230 and 231 (sequence 0) and 0 (sequence 1).
    std::vector<int32_t> q_starts;
    for (int i = 0; i < rows; ++i) {
        const int position = 200 + i;
        q_starts.push_back(position >= 231 ? 231 : position >= 230 ? 230 : 150);
    }
    q_starts.insert(q_starts.end(), rows, 0);
    const Tokens starts(b, q_starts);
    for (const DType t : kTypes) {
        INFO(name(t));
        AttentionBlock k;
        k.B = B, k.channels = channels, k.NH = NH;
        k.q_rows = k.kv_rows = rows;
        k.q_begin = 0, k.q_count = rows, k.q_position = 200;
        k.k_begin = 0, k.k_count = rows, k.k_position = 100;
        k.seq_len = 400, k.head_begin = 0, k.heads_total = NH;
        const std::size_t RC = std::size_t(B) * rows * channels, stats = std::size_t(B) * NH * rows;
        Pair qkv(b, 3 * RC, t), kv(b, 2 * RC, t), dout(b, RC, t);
        qkv.fill(5);
        kv.fill(6);
        dout.fill(7);
        Pair out(b, RC, DType::f32), lse(b, stats, DType::f32);
        AttentionBlock on_cpu = k, on_gpu = k;
        on_cpu.q_starts = starts.on_cpu();
        on_gpu.q_starts = starts.on_gpu();
        b.cpu->attention_block_forward(out.cpu.f32(), lse.cpu.f32(), qkv.cpu, kv.cpu, on_cpu);
        b.gpu->attention_block_forward(out.gpu.f32(), lse.gpu.f32(), qkv.gpu, kv.gpu, on_gpu);
        require_close(out, DType::f32, "attention_block_forward out within documents");
        Pair dq(b, RC, DType::f32), dkv(b, 2 * RC, DType::f32);
        b.cpu->attention_block_backward(dq.cpu.f32(), dkv.cpu.f32(), dout.cpu, qkv.cpu, kv.cpu,
                                        out.cpu, lse.cpu.f32(), on_cpu);
        b.gpu->attention_block_backward(dq.gpu.f32(), dkv.gpu.f32(), dout.gpu, qkv.gpu, kv.gpu,
                                        out.gpu, lse.gpu.f32(), on_gpu);
        require_close(dq, DType::f32, "attention_block_backward dq within documents");
        require_close(dkv, DType::f32, "attention_block_backward dkv within documents");
    }
}
