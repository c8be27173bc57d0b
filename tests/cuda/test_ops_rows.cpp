// The row kernels in their every form, against the CPU backend: LayerNorm from 13 channels to
// rows too wide for a block's shared memory, with many chunks of rows (some empty), its
// backward split into an input step and a weight step; the cross-entropy over a GPT-2-sized
// vocabulary and slices of odd widths; the bias gradient over odd widths. Each kernel reads
// 16-byte packs where a buffer allows and element by element where it does not (an unaligned
// buffer, an odd width): the two give the same bits, which each case checks on a buffer one
// element off alignment.
#include <catch2/catch.hpp>
#include <vector>

#include "tests/cuda/backends.h"

using namespace gpu_test;

namespace {

const DType kTypes[] = {DType::f32, DType::bf16, DType::f16};

// A GPU buffer of n elements one element past a 16-byte boundary, holding what `like` holds.
struct Unaligned {
    Backends* b;
    Ptr base, at;
    std::size_t count;
    Unaligned(Backends& backends, const Pair& like) : b(&backends), count(like.count) {
        base = b->gpu->allocate(count + 1, like.dtype);
        at = base + 1;
        b->gpu->copy(at, like.gpu, count);
    }
    ~Unaligned() { b->gpu->release(base.data); }
    std::vector<float> values() const { return Pair::host(*b->gpu, at, count); }
};

struct RowShape {
    int N, channels;
};

void layernorm_case(Backends& b, DType t, DType g, RowShape s) {
    INFO(name(t) << " (gradients " << name(g) << "), N " << s.N << ", channels " << s.channels);
    const std::size_t NC = static_cast<std::size_t>(s.N) * s.channels;
    Pair inp(b, NC, t), w(b, s.channels, t), bias(b, s.channels, t), out(b, NC, t),
        mean(b, s.N, DType::f32), rstd(b, s.N, DType::f32);
    inp.fill(1, 2.0f, 0.5f);
    w.fill(2, 0.2f, 1.0f);
    bias.fill(3, 0.1f);
    b.cpu->layernorm_forward(out.cpu, mean.cpu.f32(), rstd.cpu.f32(), inp.cpu, w.cpu, bias.cpu, s.N,
                             s.channels);
    b.gpu->layernorm_forward(out.gpu, mean.gpu.f32(), rstd.gpu.f32(), inp.gpu, w.gpu, bias.gpu, s.N,
                             s.channels);
    require_close(out, t, "layernorm_forward out");
    require_close(rstd, DType::f32, "layernorm_forward rstd");
    Pair dout(b, NC, t), dinp(b, NC, t), dw(b, s.channels, g), db(b, s.channels, g);
    dout.fill(4);
    dinp.fill(5, 0.1f);
    dw.fill(6, 0.1f);
    db.fill(7, 0.1f);
    // The split backward (input step, then weight step) from the same starting gradients.
    Unaligned split_dinp(b, dinp), split_dw(b, dw), split_db(b, db);
    b.cpu->layernorm_backward(dinp.cpu, dw.cpu, db.cpu, dout.cpu, inp.cpu, w.cpu, mean.cpu.f32(),
                              rstd.cpu.f32(), s.N, s.channels);
    b.gpu->layernorm_backward(dinp.gpu, dw.gpu, db.gpu, dout.gpu, inp.gpu, w.gpu, mean.gpu.f32(),
                              rstd.gpu.f32(), s.N, s.channels);
    require_close(dinp, t, "layernorm_backward dinp");
    require_close(dw, g, "layernorm_backward dweight");
    require_close(db, g, "layernorm_backward dbias");
    // Unaligned copies of every input: the element-by-element path, the same bits.
    Unaligned x(b, inp), gy(b, dout);
    b.gpu->layernorm_backward(split_dinp.at, Ptr(), Ptr(), gy.at, x.at, w.gpu, mean.gpu.f32(),
                              rstd.gpu.f32(), s.N, s.channels);
    b.gpu->layernorm_backward(Ptr(), split_dw.at, split_db.at, gy.at, x.at, w.gpu, mean.gpu.f32(),
                              rstd.gpu.f32(), s.N, s.channels);
    REQUIRE(split_dinp.values() == dinp.on_gpu());
    REQUIRE(split_dw.values() == dw.on_gpu());
    REQUIRE(split_db.values() == db.on_gpu());
    Unaligned y(b, out);
    b.gpu->layernorm_forward(y.at, mean.gpu.f32(), rstd.gpu.f32(), x.at, w.gpu, bias.gpu, s.N,
                             s.channels);
    REQUIRE(y.values() == out.on_gpu());
}

}  // namespace

TEST_CASE("cuda: layer norm by packs and by elements, wide rows, split backward", "[ops]") {
    Backends b;
    // 13 channels: less than a pack per lane; 768 and 1600: GPT-2's; 8192: past a block's
    // shared memory for the parameter sums; 8200 rows: 512 chunks, the last ones empty.
    for (DType t : kTypes)
        for (RowShape s : {RowShape{5, 13}, RowShape{33, 768}, RowShape{17, 1600},
                           RowShape{9, 8192}, RowShape{8200, 96}})
            layernorm_case(b, t, t, s);
    layernorm_case(b, DType::bf16, DType::f32, {300, 768});  // fp32 gradient accumulation
}

namespace {

struct Slice {
    int V, vocab_begin, Vp_local;
};

void cross_entropy_case(Backends& b, DType t, int N, const Slice& s) {
    INFO(name(t) << ", V " << s.V << ", slice " << s.vocab_begin << "+" << s.Vp_local);
    Tokens targets(b, random_tokens(N, s.V, 9));
    const std::size_t count = static_cast<std::size_t>(N) * s.Vp_local;
    Pair logits(b, count, t);
    logits.fill(1, 3.0f);
    Pair row_max(b, N, DType::f32), sumexp(b, N, DType::f32), target(b, N, DType::f32);
    b.cpu->cross_entropy_partials(row_max.cpu.f32(), sumexp.cpu.f32(), target.cpu.f32(), logits.cpu,
                                  targets.on_cpu(), N, s.vocab_begin, s.V, s.Vp_local);
    b.gpu->cross_entropy_partials(row_max.gpu.f32(), sumexp.gpu.f32(), target.gpu.f32(), logits.gpu,
                                  targets.on_gpu(), N, s.vocab_begin, s.V, s.Vp_local);
    REQUIRE(row_max.on_gpu() == row_max.on_cpu());
    require_close(sumexp, DType::f32, "partials row_sumexp");
    REQUIRE(target.on_gpu() == target.on_cpu());
    Unaligned moved(b, logits);
    Pair sumexp_moved(b, N, DType::f32), max_moved(b, N, DType::f32),
        target_moved(b, N, DType::f32);
    b.gpu->cross_entropy_partials(max_moved.gpu.f32(), sumexp_moved.gpu.f32(),
                                  target_moved.gpu.f32(), moved.at, targets.on_gpu(), N,
                                  s.vocab_begin, s.V, s.Vp_local);
    REQUIRE(sumexp_moved.on_gpu() == sumexp.on_gpu());
    // The backward from the CPU's log-sum-exp, in place on both.
    Pair lse(b, N, DType::f32);
    std::vector<float> l = row_max.on_cpu(), z = sumexp.on_cpu();
    for (int n = 0; n < N; ++n) l[n] = (std::isfinite(l[n]) ? l[n] : 0.0f) + std::log(z[n] + 1.0f);
    lse.set(l);
    b.cpu->cross_entropy_backward(logits.cpu, logits.cpu, lse.cpu.f32(), targets.on_cpu(), 0.01f, N,
                                  s.vocab_begin, s.V, s.Vp_local);
    b.gpu->cross_entropy_backward(moved.at, moved.at, lse.gpu.f32(), targets.on_gpu(), 0.01f, N,
                                  s.vocab_begin, s.V, s.Vp_local);
    b.gpu->cross_entropy_backward(logits.gpu, logits.gpu, lse.gpu.f32(), targets.on_gpu(), 0.01f, N,
                                  s.vocab_begin, s.V, s.Vp_local);
    require_close(logits, t, "cross_entropy_backward");
    REQUIRE(moved.values() == logits.on_gpu());
}

}  // namespace

TEST_CASE("cuda: cross-entropy over a GPT-2 vocabulary and odd slices, by packs and elements",
          "[ops]") {
    Backends b;
    for (DType t : kTypes) {
        // GPT-2's padded vocabulary whole, and split over two tensor-parallel ranks.
        for (const Slice& s : {Slice{50257, 0, 50304}, Slice{50257, 25152, 25152}})
            cross_entropy_case(b, t, 3, s);
        // Slices of an odd width: rows start off the 16-byte boundary.
        for (const Slice& s : {Slice{1000, 0, 577}, Slice{1000, 577, 577}})
            cross_entropy_case(b, t, 21, s);
    }
}

TEST_CASE("cuda: bias gradient over many rows and odd widths", "[ops]") {
    Backends b;
    for (DType t : kTypes) {
        for (const int OC : {100, 136, 2304}) {
            const int N = 1000, channels = 8;
            INFO(name(t) << ", OC " << OC);
            Pair dout(b, std::size_t(N) * OC, t), inp(b, std::size_t(N) * channels, t),
                w(b, std::size_t(OC) * channels, t), db(b, OC, t);
            dout.fill(1);
            db.fill(2, 0.1f);
            Unaligned moved_db(b, db), moved_dout(b, dout);
            b.cpu->matmul_backward(Ptr(), Ptr(), db.cpu, dout.cpu, inp.cpu, w.cpu, N, channels, OC);
            b.gpu->matmul_backward(Ptr(), Ptr(), db.gpu, dout.gpu, inp.gpu, w.gpu, N, channels, OC);
            require_close(db, t, "matmul_backward dbias");
            b.gpu->matmul_backward(Ptr(), Ptr(), moved_db.at, moved_dout.at, inp.gpu, w.gpu, N,
                                   channels, OC);
            REQUIRE(moved_db.values() == db.on_gpu());
        }
    }
}
