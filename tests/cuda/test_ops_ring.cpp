// Context parallelism's ops on the GPU against the CPU backend: ring attention's blocks (a block
// of queries against a block of keys, the merge of two blocks' results, a block's backward) for
// head sizes that take each thread layout of the kernels, blocks that see all, some and none of
// their keys, several tiles and thread blocks, with and without dropout; the packing copies
// between strided tensors; and the embedding at a rank's own positions.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tests/cuda/backends.h"

using namespace gpu_test;
using trident::kernels::AttentionBlock;

namespace {

const DType kTypes[] = {DType::f32, DType::bf16, DType::f16};

// Log-sum-exps: -inf (a row that saw no key) in the same places on both sides, the rest close.
void require_same_lse(const Pair& lse, const std::string& what) {
    const std::vector<float> gpu = lse.on_gpu(), cpu = lse.on_cpu();
    std::vector<float> gpu_finite, cpu_finite;
    for (std::size_t i = 0; i < cpu.size(); ++i) {
        INFO(what << ": row " << i << ": " << gpu[i] << " on the GPU, " << cpu[i] << " on the CPU");
        REQUIRE(std::isinf(gpu[i]) == std::isinf(cpu[i]));
        if (std::isinf(cpu[i])) continue;
        gpu_finite.push_back(gpu[i]);
        cpu_finite.push_back(cpu[i]);
    }
    require_close(gpu_finite, cpu_finite, DType::f32, what);
}

struct Geometry {
    int hs, q_begin, q_count, q_position, k_begin, k_count, k_position;
};

}  // namespace

TEST_CASE("cuda: ring attention's blocks against the CPU", "[ring]") {
    Backends b;
    const int B = 2, NH = 2, rows = 150, seq_len = 400;
    // Head sizes of one, two and four threads a row; a diagonal block (causal), a block partly
    // seen, and one whose first 40 rows see no key; 70 to 150 rows: several tiles of 32 and
    // thread blocks of 64.
    for (const Geometry& g :
         {Geometry{8, 0, 150, 0, 0, 150, 0}, Geometry{40, 10, 100, 200, 30, 90, 150},
          Geometry{64, 5, 70, 0, 0, 120, 40}, Geometry{128, 0, 130, 130, 20, 130, 0}}) {
        for (DType t : kTypes) {
            for (float drop : {0.0f, 0.1f}) {
                INFO(name(t) << ", hs " << g.hs << ", queries " << g.q_begin << "+" << g.q_count
                             << " at " << g.q_position << ", keys " << g.k_begin << "+" << g.k_count
                             << " at " << g.k_position << ", dropout " << drop);
                const int channels = NH * g.hs;
                AttentionBlock k;
                k.B = B, k.channels = channels, k.NH = NH;
                k.q_rows = k.kv_rows = rows;
                k.q_begin = g.q_begin, k.q_count = g.q_count, k.q_position = g.q_position;
                k.k_begin = g.k_begin, k.k_count = g.k_count, k.k_position = g.k_position;
                k.seq_len = seq_len, k.drop_prob = drop, k.seed = 31;
                k.head_begin = 1, k.heads_total = 2 * NH;
                const std::size_t RC = std::size_t(B) * rows * channels,
                                  stats = std::size_t(B) * NH * rows;
                Pair qkv(b, 3 * RC, t), kv(b, 2 * RC, t);
                qkv.fill(1);
                kv.fill(2);
                Pair out(b, RC, DType::f32), lse(b, stats, DType::f32);
                b.cpu->attention_block_forward(out.cpu.f32(), lse.cpu.f32(), qkv.cpu, kv.cpu, k);
                b.gpu->attention_block_forward(out.gpu.f32(), lse.gpu.f32(), qkv.gpu, kv.gpu, k);
                require_close(out, DType::f32, "attention_block_forward out");
                require_same_lse(lse, "attention_block_forward lse");

                // A second block over the same queries (keys 0.. of another rank), merged into
                // the first's result.
                AttentionBlock other = k;
                other.k_begin = 0, other.k_count = 60, other.k_position = 0;
                Pair out2(b, RC, DType::f32), lse2(b, stats, DType::f32);
                b.cpu->attention_block_forward(out2.cpu.f32(), lse2.cpu.f32(), qkv.cpu, kv.cpu,
                                               other);
                b.gpu->attention_block_forward(out2.gpu.f32(), lse2.gpu.f32(), qkv.gpu, kv.gpu,
                                               other);
                b.cpu->attention_merge(out.cpu.f32(), lse.cpu.f32(), out2.cpu.f32(), lse2.cpu.f32(),
                                       B, rows, channels, NH, k.q_begin, k.q_count);
                b.gpu->attention_merge(out.gpu.f32(), lse.gpu.f32(), out2.gpu.f32(), lse2.gpu.f32(),
                                       B, rows, channels, NH, k.q_begin, k.q_count);
                require_close(out, DType::f32, "attention_merge out");
                require_same_lse(lse, "attention_merge lse");

                // The block's backward, adding into gradients that hold values, from an output
                // in the inputs' type and the merged log-sum-exp.
                Pair dout(b, RC, t), whole(b, RC, t), dq(b, RC, DType::f32),
                    dkv(b, 2 * RC, DType::f32);
                dout.fill(3);
                whole.fill(4, 0.5f);
                dq.fill(5, 0.1f);
                dkv.fill(6, 0.1f);
                b.cpu->attention_block_backward(dq.cpu.f32(), dkv.cpu.f32(), dout.cpu, qkv.cpu,
                                                kv.cpu, whole.cpu, lse.cpu.f32(), k);
                b.gpu->attention_block_backward(dq.gpu.f32(), dkv.gpu.f32(), dout.gpu, qkv.gpu,
                                                kv.gpu, whole.gpu, lse.gpu.f32(), k);
                require_close(dq, DType::f32, "attention_block_backward dq");
                require_close(dkv, DType::f32, "attention_block_backward dkv");
            }
        }
    }
}

TEST_CASE("cuda: copy_2d packs columns between strided tensors, in one type and across types",
          "[ring]") {
    Backends b;
    const std::size_t rows = 37, cols = 23, in_stride = 61, out_stride = 45;
    for (DType from : kTypes) {
        for (DType to : kTypes) {
            INFO(name(from) << " -> " << name(to));
            Pair in(b, rows * in_stride, from), out(b, rows * out_stride, to);
            in.fill(1);
            out.fill(2);  // the columns not copied keep these
            b.cpu->copy_2d(out.cpu + 7, out_stride, in.cpu + 11, in_stride, rows, cols);
            b.gpu->copy_2d(out.gpu + 7, out_stride, in.gpu + 11, in_stride, rows, cols);
            REQUIRE(out.on_gpu() == out.on_cpu());  // a copy, or one rounding on both
        }
    }
}

TEST_CASE("cuda: embedding at a context rank's positions, and long runs of one token", "[ring]") {
    Backends b;
    const int B = 3, T = 12, channels = 96, wpe_rows = 32;
    // Distinct positions below wpe_rows, out of order (a context rank's two chunks).
    const std::vector<int32_t> positions = {20, 21, 22, 23, 3, 4, 5, 6, 28, 29, 30, 31};
    for (DType t : kTypes) {
        // Few tokens (long runs of one after the sort), some outside the slice [2, 2 + 3).
        Tokens tokens(b, random_tokens(static_cast<std::size_t>(B) * T, 6, 3));
        Tokens at(b, positions);
        Pair wte(b, 3 * std::size_t(channels), t), wpe(b, std::size_t(wpe_rows) * channels, t);
        wte.fill(4);
        wpe.fill(5);
        Pair out(b, std::size_t(B) * T * channels, t);
        b.cpu->embedding_forward(out.cpu, tokens.on_cpu(), wte.cpu, wpe.cpu, B, T, channels, 2, 3,
                                 at.on_cpu(), wpe_rows);
        b.gpu->embedding_forward(out.gpu, tokens.on_gpu(), wte.gpu, wpe.gpu, B, T, channels, 2, 3,
                                 at.on_gpu(), wpe_rows);
        require_close(out, t, "embedding_forward at positions");
        Pair dout(b, out.count, t), dwte(b, wte.count, DType::f32), dwpe(b, wpe.count, t);
        dout.fill(6);
        dwte.fill(7, 0.1f);
        dwpe.fill(8, 0.1f);
        b.cpu->embedding_backward(dwte.cpu, dwpe.cpu, dout.cpu, tokens.on_cpu(), B, T, channels, 2,
                                  3, at.on_cpu(), wpe_rows);
        b.gpu->embedding_backward(dwte.gpu, dwpe.gpu, dout.gpu, tokens.on_gpu(), B, T, channels, 2,
                                  3, at.on_gpu(), wpe_rows);
        require_close(dwte, DType::f32, "embedding_backward dwte at positions");
        require_close(dwpe, t, "embedding_backward dwpe at positions");
    }
    // Many positions: runs of hundreds of one token, and every token distinct.
    for (int vocab : {7, 50000}) {
        INFO("vocabulary " << vocab);
        const int N = 4096;
        Tokens tokens(b, random_tokens(N, vocab, 9));
        Pair dout(b, std::size_t(N) * channels, DType::bf16),
            dwte(b, std::size_t(vocab) * channels, DType::f32);
        dout.fill(10);
        b.cpu->embedding_backward(dwte.cpu, Ptr(), dout.cpu, tokens.on_cpu(), 1, N, channels, 0,
                                  vocab, nullptr, N);
        b.gpu->embedding_backward(dwte.gpu, Ptr(), dout.gpu, tokens.on_gpu(), 1, N, channels, 0,
                                  vocab, nullptr, N);
        require_close(dwte, DType::f32, "embedding_backward dwte, many positions");
    }
}
