// Every CUDA op against the CPU backend on random inputs, in fp32 (relative error <= 1e-5),
// bf16 and fp16 (a few units of the type's rounding, backends.h), and with mixed element
// types (the fp32 views).
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <string>

#include "kernels/error.h"
#include "tests/cuda/backends.h"

using namespace gpu_test;

namespace {

const DType kTypes[] = {DType::f32, DType::bf16, DType::f16};

}  // namespace

TEST_CASE("cuda: memory, copies and conversions", "[ops]") {
    Backends b;
    for (DType t : kTypes) {
        const std::size_t n = 1000;
        Ptr zeros = b.gpu->allocate(n, t);  // zero-filled
        std::vector<float> values(n);
        b.gpu->copy_to_host(values.data(), zeros, n);
        for (float v : values) REQUIRE(v == 0.0f);
        Pair x(b, n, t);
        x.fill(1, 3.0f);
        REQUIRE(x.on_gpu() == x.on_cpu());  // the same rounding into the type on both sides
        b.gpu->copy(zeros, x.gpu, n);
        REQUIRE(Pair::host(*b.gpu, zeros, n) == x.on_cpu());
        b.gpu->zero(zeros, n / 2);
        REQUIRE(Pair::host(*b.gpu, zeros, n)[n / 2 - 1] == 0.0f);
        b.gpu->release(zeros.data);
        for (DType to : kTypes) {
            Pair y(b, n, to);
            b.cpu->convert(y.cpu, x.cpu, n);
            b.gpu->convert(y.gpu, x.gpu, n);
            INFO(name(t) << " -> " << name(to));
            REQUIRE(y.on_gpu() == y.on_cpu());  // rounding to nearest even on both
        }
    }
    // Values at the edges of the 16-bit types: overflow to inf, subnormals, ties.
    std::vector<float> edges = {70000.0f, -1e-7f, 3e-5f, 1.0f + 1.0f / 512,
                                65504.0f, 1e38f,  0.0f,  -0.0f};
    for (DType to : {DType::bf16, DType::f16}) {
        Pair x(b, edges.size(), DType::f32), y(b, edges.size(), to);
        x.set(edges);
        b.cpu->convert(y.cpu, x.cpu, edges.size());
        b.gpu->convert(y.gpu, x.gpu, edges.size());
        REQUIRE(y.on_gpu() == y.on_cpu());
    }
    // The allocator counts what is in use.
    const std::size_t before = b.gpu->allocated_bytes();
    Ptr p = b.gpu->allocate(1 << 20, DType::f32);
    REQUIRE(b.gpu->allocated_bytes() >= before + (4u << 20));
    b.gpu->release(p.data);
    REQUIRE(b.gpu->allocated_bytes() == before);
    REQUIRE(b.gpu->peak_allocated_bytes() >= before + (4u << 20));
    b.gpu->reset_peak_allocated_bytes();
    REQUIRE(b.gpu->peak_allocated_bytes() == before);
    // Raw bytes both ways.
    const std::vector<int32_t> ids = random_tokens(777, 50000, 4);
    Ptr raw = b.gpu->allocate(ids.size(), DType::f32);
    b.gpu->upload(raw.data, ids.data(), ids.size() * sizeof(int32_t));
    std::vector<int32_t> back(ids.size(), -1);
    b.gpu->download(back.data(), raw.data, back.size() * sizeof(int32_t));
    REQUIRE(back == ids);
    b.gpu->release(raw.data);
}

TEST_CASE("cuda: embedding forward and backward, vocab-parallel, deterministic", "[ops]") {
    Backends b;
    const int B = 3, T = 17, channels = 40, V = 50;
    for (DType t : kTypes) {
        for (auto [vocab_begin, vocab_local] : {std::pair{0, 50}, std::pair{20, 16}}) {
            INFO("slice " << vocab_begin << "+" << vocab_local);
            Tokens tokens(b, random_tokens(static_cast<std::size_t>(B) * T, V, 3));
            Pair wte(b, std::size_t(vocab_local) * channels, t),
                wpe(b, std::size_t(T) * channels, t);
            wte.fill(4);
            wpe.fill(5);
            Pair out(b, std::size_t(B) * T * channels, t);
            for (bool with_wpe : {true, false}) {
                b.cpu->embedding_forward(out.cpu, tokens.on_cpu(), wte.cpu,
                                         with_wpe ? wpe.cpu : Ptr(), B, T, channels, vocab_begin,
                                         vocab_local, nullptr, T);
                b.gpu->embedding_forward(out.gpu, tokens.on_gpu(), wte.gpu,
                                         with_wpe ? wpe.gpu : Ptr(), B, T, channels, vocab_begin,
                                         vocab_local, nullptr, T);
                require_close(out, t, "embedding_forward");
            }
            // Backward adds into gradients that already hold values; gradients in the
            // activations' type and in fp32.
            for (DType g : {t, DType::f32}) {
                Pair dout(b, std::size_t(B) * T * channels, t), dwte(b, wte.count, g),
                    dwpe(b, wpe.count, g);
                dout.fill(6);
                dwte.fill(7, 0.1f);
                dwpe.fill(8, 0.1f);
                b.cpu->embedding_backward(dwte.cpu, dwpe.cpu, dout.cpu, tokens.on_cpu(), B, T,
                                          channels, vocab_begin, vocab_local, nullptr, T);
                b.gpu->embedding_backward(dwte.gpu, dwpe.gpu, dout.gpu, tokens.on_gpu(), B, T,
                                          channels, vocab_begin, vocab_local, nullptr, T);
                require_close(dwte, g, "embedding_backward dwte");
                require_close(dwpe, g, "embedding_backward dwpe");
                b.gpu->zero(dwte.gpu, dwte.count);
                b.gpu->embedding_backward(dwte.gpu, Ptr(), dout.gpu, tokens.on_gpu(), B, T,
                                          channels, vocab_begin, vocab_local, nullptr, T);
                const std::vector<float> again = dwte.on_gpu();
                b.gpu->zero(dwte.gpu, dwte.count);
                b.gpu->embedding_backward(dwte.gpu, Ptr(), dout.gpu, tokens.on_gpu(), B, T,
                                          channels, vocab_begin, vocab_local, nullptr, T);
                REQUIRE(dwte.on_gpu() == again);  // bit for bit, run to run
            }
        }
    }
}

TEST_CASE("cuda: layer norm forward and backward", "[ops]") {
    Backends b;
    const int N = 67, channels = 300;
    for (DType t : kTypes) {
        for (DType g : {t, DType::f32}) {
            Pair inp(b, std::size_t(N) * channels, t), w(b, channels, t), bias(b, channels, t),
                out(b, std::size_t(N) * channels, t);
            inp.fill(1, 2.0f, 0.5f);
            w.fill(2, 0.2f, 1.0f);
            bias.fill(3, 0.1f);
            Pair mean(b, N, DType::f32), rstd(b, N, DType::f32);
            b.cpu->layernorm_forward(out.cpu, mean.cpu.f32(), rstd.cpu.f32(), inp.cpu, w.cpu,
                                     bias.cpu, N, channels);
            b.gpu->layernorm_forward(out.gpu, mean.gpu.f32(), rstd.gpu.f32(), inp.gpu, w.gpu,
                                     bias.gpu, N, channels);
            require_close(out, t, "layernorm_forward out");
            require_close(mean, DType::f32, "layernorm_forward mean");
            require_close(rstd, DType::f32, "layernorm_forward rstd");
            Pair dout(b, out.count, t), dinp(b, out.count, t), dw(b, channels, g),
                db(b, channels, g);
            dout.fill(4);
            dinp.fill(5, 0.1f);
            dw.fill(6, 0.1f);
            db.fill(7, 0.1f);
            b.cpu->layernorm_backward(dinp.cpu, dw.cpu, db.cpu, dout.cpu, inp.cpu, w.cpu,
                                      mean.cpu.f32(), rstd.cpu.f32(), N, channels);
            b.gpu->layernorm_backward(dinp.gpu, dw.gpu, db.gpu, dout.gpu, inp.gpu, w.gpu,
                                      mean.gpu.f32(), rstd.gpu.f32(), N, channels);
            require_close(dinp, t, "layernorm_backward dinp");
            require_close(dw, g, "layernorm_backward dweight");
            require_close(db, g, "layernorm_backward dbias");
        }
    }
}

TEST_CASE("cuda: matmul forward and backward, bias, += and null gradients", "[ops]") {
    Backends b;
    const int N = 96, channels = 72, OC = 136;
    for (DType t : kTypes) {
        Pair inp(b, std::size_t(N) * channels, t), w(b, std::size_t(OC) * channels, t),
            bias(b, OC, t);
        inp.fill(1);
        w.fill(2, 0.1f);
        bias.fill(3);
        Pair out(b, std::size_t(N) * OC, t);
        for (bool with_bias : {true, false}) {
            b.cpu->matmul_forward(out.cpu, inp.cpu, w.cpu, with_bias ? bias.cpu : Ptr(), N,
                                  channels, OC);
            b.gpu->matmul_forward(out.gpu, inp.gpu, w.gpu, with_bias ? bias.gpu : Ptr(), N,
                                  channels, OC);
            require_close(out, t, with_bias ? "matmul_forward with bias" : "matmul_forward");
        }
        b.cpu->add_bias(out.cpu, bias.cpu, N, OC);
        b.gpu->add_bias(out.gpu, bias.gpu, N, OC);
        require_close(out, t, "add_bias");
        for (DType g : {t, DType::f32}) {
            Pair dout(b, out.count, t), dinp(b, inp.count, t), dw(b, w.count, g), db(b, OC, g);
            dout.fill(4);
            dinp.fill(5, 0.1f);
            dw.fill(6, 0.1f);
            db.fill(7, 0.1f);
            b.cpu->matmul_backward(dinp.cpu, dw.cpu, db.cpu, dout.cpu, inp.cpu, w.cpu, N, channels,
                                   OC);
            b.gpu->matmul_backward(dinp.gpu, dw.gpu, db.gpu, dout.gpu, inp.gpu, w.gpu, N, channels,
                                   OC);
            require_close(dinp, t, "matmul_backward dinp");
            require_close(dw, g, "matmul_backward dweight");
            require_close(db, g, "matmul_backward dbias");
            b.cpu->matmul_backward(Ptr(), dw.cpu, Ptr(), dout.cpu, inp.cpu, w.cpu, N, channels, OC);
            b.gpu->matmul_backward(Ptr(), dw.gpu, Ptr(), dout.gpu, inp.gpu, w.gpu, N, channels, OC);
            require_close(dw, g, "matmul_backward dweight alone");
        }
    }
}

TEST_CASE("cuda: fp32 products run in TF32 when asked, in true fp32 otherwise", "[ops]") {
    Backends b;  // its GPU backend: true fp32
    const auto tf32 = trident::kernels::make_cuda_ops(true);
    const int N = 64, channels = 256, OC = 128;
    Pair inp(b, std::size_t(N) * channels, DType::f32),
        w(b, std::size_t(OC) * channels, DType::f32), out(b, std::size_t(N) * OC, DType::f32);
    const Ptr tf32_out = tf32->allocate(out.count, DType::f32);
    const auto product_error = [&] {
        b.cpu->matmul_forward(out.cpu, inp.cpu, w.cpu, Ptr(), N, channels, OC);
        b.gpu->matmul_forward(out.gpu, inp.gpu, w.gpu, Ptr(), N, channels, OC);
        require_close(out, DType::f32, "matmul_forward in true fp32");
        tf32->matmul_forward(tf32_out, inp.gpu, w.gpu, Ptr(), N, channels, OC);
        return relative_error(Pair::host(*tf32, tf32_out, out.count), out.on_cpu());
    };
    // Full 24-bit mantissas: TF32 keeps 11 bits of each input, so its products are off by
    // about 2^-11 of an input, which true fp32 (1e-5 at most) is not.
    inp.fill(1);
    w.fill(2, 0.1f);
    const double rounded = product_error();
    INFO("TF32 against the CPU, full-mantissa inputs: relative error " << rounded);
    REQUIRE(rounded > 1e-5);
    REQUIRE(rounded < 5e-3);
    // Inputs TF32 holds exactly (multiples of 1/8 below 16): only the inputs are rounded, the
    // products and their fp32 sums (exact here) are as the CPU's.
    const auto exact = [](std::size_t count, std::size_t seed) {
        std::vector<float> values(count);
        for (std::size_t i = 0; i < count; ++i)
            values[i] = static_cast<float>(static_cast<int>((i * 37 + seed) % 127) - 63) / 8.0f;
        return values;
    };
    inp.set(exact(inp.count, 1));
    w.set(exact(w.count, 2));
    REQUIRE(product_error() == 0.0);
    tf32->release(tf32_out.data);
}

TEST_CASE("cuda: mixed element types go through fp32 views", "[ops]") {
    Backends b;
    const int N = 40, channels = 24, OC = 56;
    Pair inp(b, std::size_t(N) * channels, DType::bf16),
        w(b, std::size_t(OC) * channels, DType::f32), bias(b, OC, DType::f16),
        out(b, std::size_t(N) * OC, DType::bf16);
    inp.fill(1);
    w.fill(2, 0.1f);
    bias.fill(3);
    b.cpu->matmul_forward(out.cpu, inp.cpu, w.cpu, bias.cpu, N, channels, OC);
    b.gpu->matmul_forward(out.gpu, inp.gpu, w.gpu, bias.gpu, N, channels, OC);
    require_close(out, DType::bf16, "matmul_forward bf16 x fp32 + fp16");
    Pair ln_out(b, std::size_t(N) * channels, DType::f16), ln_w(b, channels, DType::f32),
        ln_b(b, channels, DType::bf16);
    ln_w.fill(4, 0.1f, 1.0f);
    ln_b.fill(5, 0.1f);
    Pair mean(b, N, DType::f32), rstd(b, N, DType::f32);
    b.cpu->layernorm_forward(ln_out.cpu, mean.cpu.f32(), rstd.cpu.f32(), inp.cpu, ln_w.cpu,
                             ln_b.cpu, N, channels);
    b.gpu->layernorm_forward(ln_out.gpu, mean.gpu.f32(), rstd.gpu.f32(), inp.gpu, ln_w.gpu,
                             ln_b.gpu, N, channels);
    require_close(ln_out, DType::f16, "layernorm_forward mixed");
    // In place, a bf16 buffer both read and written beside an fp32 one: one view serves both.
    Pair x(b, 500, DType::bf16), y(b, 500, DType::f32);
    x.fill(6);
    y.fill(7);
    b.cpu->residual_forward(x.cpu, x.cpu, y.cpu, 500);
    b.gpu->residual_forward(x.gpu, x.gpu, y.gpu, 500);
    require_close(x, DType::bf16, "residual_forward in place, bf16 + fp32");
}

TEST_CASE("cuda: causal attention (flash kernels and cuDNN) against the CPU", "[ops]") {
    Backends b;
    struct Case {
        int B, T, channels, NH;
        float drop;
    };
    for (const Case& k :
         {Case{2, 37, 64, 4, 0.0f}, Case{1, 70, 96, 3, 0.0f}, Case{2, 64, 256, 4, 0.0f},
          Case{2, 128, 256, 2, 0.0f}, Case{2, 33, 48, 2, 0.2f}, Case{1, 40, 200, 2, 0.1f},
          Case{1, 128, 256, 4, 0.1f}}) {
        for (DType t : kTypes) {
            INFO(name(t) << ", B " << k.B << " T " << k.T << " channels " << k.channels << " NH "
                         << k.NH << " drop " << k.drop);
            const std::size_t BTC = std::size_t(k.B) * k.T * k.channels;
            // What each backend keeps differs (CPU: probabilities; GPU: log-sum-exp per row).
            const auto cpu_saved = b.cpu->attention_saved(k.B, k.NH, k.T, t);
            const auto gpu_saved = b.gpu->attention_saved(k.B, k.NH, k.T, t);
            Pair qkv(b, 3 * BTC, t), out(b, BTC, t), saved_cpu(b, cpu_saved.count, cpu_saved.dtype),
                saved_gpu(b, gpu_saved.count, gpu_saved.dtype);
            qkv.fill(1);
            const uint64_t seed = 99;
            // Heads 1.. of 2*NH: the mask index depends on the global head, as under tensor
            // parallelism.
            b.cpu->attention_forward(out.cpu, saved_cpu.cpu, qkv.cpu, k.B, k.T, k.channels, k.NH,
                                     k.drop, seed, 1, 2 * k.NH);
            b.gpu->attention_forward(out.gpu, saved_gpu.gpu, qkv.gpu, k.B, k.T, k.channels, k.NH,
                                     k.drop, seed, 1, 2 * k.NH);
            // 16-bit runs without dropout may take cuDNN's kernels.
            const double limit = gpu_test::attention_tolerance(t);
            require_within(out.on_gpu(), out.on_cpu(), limit, "attention_forward");
            Pair dout(b, BTC, t), dqkv(b, 3 * BTC, t);
            dout.fill(2);
            dqkv.fill(3, 0.1f);
            b.cpu->attention_backward(dqkv.cpu, dout.cpu, qkv.cpu, out.cpu, saved_cpu.cpu, k.B, k.T,
                                      k.channels, k.NH, k.drop, seed, 1, 2 * k.NH);
            b.gpu->attention_backward(dqkv.gpu, dout.gpu, qkv.gpu, out.gpu, saved_gpu.gpu, k.B, k.T,
                                      k.channels, k.NH, k.drop, seed, 1, 2 * k.NH);
            require_within(dqkv.on_gpu(), dqkv.on_cpu(), limit, "attention_backward");
            // Selective recompute: the rebuilt statistics give the same gradient.
            Pair first(b, 3 * BTC, t), again(b, 3 * BTC, t);  // zero-filled
            b.gpu->attention_backward(first.gpu, dout.gpu, qkv.gpu, out.gpu, saved_gpu.gpu, k.B,
                                      k.T, k.channels, k.NH, k.drop, seed, 1, 2 * k.NH);
            b.gpu->attention_rebuild(saved_gpu.gpu, qkv.gpu, k.B, k.T, k.channels, k.NH, k.drop);
            b.gpu->attention_backward(again.gpu, dout.gpu, qkv.gpu, out.gpu, saved_gpu.gpu, k.B,
                                      k.T, k.channels, k.NH, k.drop, seed, 1, 2 * k.NH);
            require_close(again.on_gpu(), first.on_gpu(), t,
                          "attention_backward after attention_rebuild");
        }
    }
}

TEST_CASE("cuda: GELU, residual, ReLU, product and dropout", "[ops]") {
    Backends b;
    const std::size_t n = 10007;  // not a whole number of 16-byte packs
    for (DType t : kTypes) {
        Pair x(b, n, t), y(b, n, t), out(b, n, t), dx(b, n, t);
        x.fill(1, 2.0f);
        y.fill(2);
        b.cpu->gelu_forward(out.cpu, x.cpu, n);
        b.gpu->gelu_forward(out.gpu, x.gpu, n);
        require_close(out, t, "gelu_forward");
        dx.fill(3, 0.1f);
        b.cpu->gelu_backward(dx.cpu, x.cpu, y.cpu, n);
        b.gpu->gelu_backward(dx.gpu, x.gpu, y.gpu, n);
        require_close(dx, t, "gelu_backward");
        b.cpu->residual_forward(out.cpu, x.cpu, y.cpu, n);
        b.gpu->residual_forward(out.gpu, x.gpu, y.gpu, n);
        require_close(out, t, "residual_forward");
        b.cpu->relu_forward(out.cpu, x.cpu, n);
        b.gpu->relu_forward(out.gpu, x.gpu, n);
        REQUIRE(out.on_gpu() == out.on_cpu());              // a select: exact
        b.cpu->multiply(out.cpu, out.cpu, y.cpu, n, 2.0f);  // in place
        b.gpu->multiply(out.gpu, out.gpu, y.gpu, n, 2.0f);
        require_close(out, t, "multiply");
        // Rows of 1009 scaled by 10007 / 1009 fp32 factors (the remainder left as it was).
        const std::size_t cols = 1009, rows = n / cols;
        Pair factors(b, rows, DType::f32);
        factors.fill(4);
        b.cpu->scale_rows(out.cpu, x.cpu, static_cast<const float*>(factors.cpu.data), rows, cols);
        b.gpu->scale_rows(out.gpu, x.gpu, static_cast<const float*>(factors.gpu.data), rows, cols);
        require_close(out, t, "scale_rows");
        b.cpu->scale_rows(out.cpu, out.cpu, static_cast<const float*>(factors.cpu.data), rows,
                          cols);  // in place
        b.gpu->scale_rows(out.gpu, out.gpu, static_cast<const float*>(factors.gpu.data), rows,
                          cols);
        require_close(out, t, "scale_rows in place");
        // The same mask on both backends: the kept elements, scaled, are equal exactly.
        b.cpu->dropout_forward(out.cpu, x.cpu, n, 0.3f, 5, 1234);
        b.gpu->dropout_forward(out.gpu, x.gpu, n, 0.3f, 5, 1234);
        REQUIRE(out.on_gpu() == out.on_cpu());
        b.cpu->dropout_forward(x.cpu, x.cpu, n, 0.5f, 6, 0);  // in place
        b.gpu->dropout_forward(x.gpu, x.gpu, n, 0.5f, 6, 0);
        REQUIRE(x.on_gpu() == x.on_cpu());
        b.cpu->dropout_backward(dx.cpu, y.cpu, n, 0.3f, 5, 1234);
        b.gpu->dropout_backward(dx.gpu, y.gpu, n, 0.3f, 5, 1234);
        require_close(dx, t, "dropout_backward");
    }
    // The mask itself, element by element, against kernels::dropout_keep.
    Pair ones(b, 4096, DType::f32), kept(b, 4096, DType::f32);
    ones.set(std::vector<float>(4096, 1.0f));
    b.gpu->dropout_forward(kept.gpu, ones.gpu, 4096, 0.25f, 77, 1ull << 40);
    const std::vector<float> mask = kept.on_gpu();
    for (std::size_t i = 0; i < mask.size(); ++i)
        REQUIRE((mask[i] != 0.0f) == trident::kernels::dropout_keep(77, (1ull << 40) + i, 0.25f));
}

TEST_CASE("cuda: vocab-parallel cross-entropy", "[ops]") {
    Backends b;
    const int N = 33, V = 1000, Vp = 1152;
    const std::vector<int32_t> ids = random_tokens(N, V, 9);
    for (DType t : kTypes) {
        // Two slices of the padded vocabulary, as two tensor-parallel ranks hold them; the
        // second holds real columns then padding.
        for (auto [vocab_begin, Vp_local] :
             {std::pair{0, 576}, std::pair{576, 576}, std::pair{0, Vp}}) {
            INFO("slice " << vocab_begin << "+" << Vp_local);
            Tokens targets(b, ids);
            Pair logits(b, std::size_t(N) * Vp_local, t);
            logits.fill(1, 3.0f);
            Pair row_max(b, N, DType::f32), sumexp(b, N, DType::f32), target(b, N, DType::f32);
            b.cpu->cross_entropy_partials(row_max.cpu.f32(), sumexp.cpu.f32(), target.cpu.f32(),
                                          logits.cpu, targets.on_cpu(), N, vocab_begin, V,
                                          Vp_local);
            b.gpu->cross_entropy_partials(row_max.gpu.f32(), sumexp.gpu.f32(), target.gpu.f32(),
                                          logits.gpu, targets.on_gpu(), N, vocab_begin, V,
                                          Vp_local);
            REQUIRE(row_max.on_gpu() == row_max.on_cpu());  // a max is exact
            require_close(sumexp, DType::f32, "partials row_sumexp");
            REQUIRE(target.on_gpu() == target.on_cpu());
            // Rescale against a larger "global" max, then the losses.
            Pair global(b, N, DType::f32);
            std::vector<float> g = row_max.on_cpu();
            for (float& x : g) x = (std::isfinite(x) ? x : 0.0f) + 0.5f;
            global.set(g);
            b.cpu->cross_entropy_rescale(sumexp.cpu.f32(), row_max.cpu.f32(), global.cpu.f32(), N);
            b.gpu->cross_entropy_rescale(sumexp.gpu.f32(), row_max.gpu.f32(), global.gpu.f32(), N);
            require_close(sumexp, DType::f32, "rescale");
            Pair losses(b, N, DType::f32), lse(b, N, DType::f32);
            b.cpu->cross_entropy_losses(losses.cpu.f32(), lse.cpu.f32(), global.cpu.f32(),
                                        sumexp.cpu.f32(), target.cpu.f32(), N);
            b.gpu->cross_entropy_losses(losses.gpu.f32(), lse.gpu.f32(), global.gpu.f32(),
                                        sumexp.gpu.f32(), target.gpu.f32(), N);
            require_close(lse, DType::f32, "lse");
            require_close(losses, DType::f32, "losses");
            // Backward in place over the logits, as the model runs it.
            b.cpu->cross_entropy_backward(logits.cpu, logits.cpu, lse.cpu.f32(), targets.on_cpu(),
                                          0.01f, N, vocab_begin, V, Vp_local);
            b.gpu->cross_entropy_backward(logits.gpu, logits.gpu, lse.gpu.f32(), targets.on_gpu(),
                                          0.01f, N, vocab_begin, V, Vp_local);
            require_close(logits, t, "cross_entropy_backward");
        }
    }
}

TEST_CASE("cuda: sum of squares, scale and AdamW", "[ops]") {
    Backends b;
    const std::size_t n = 100003;
    for (DType t : kTypes) {
        Pair g(b, n, t);
        g.fill(1, 0.01f);
        const double cpu = b.cpu->sum_of_squares(g.cpu, n), gpu = b.gpu->sum_of_squares(g.gpu, n);
        REQUIRE(std::abs(gpu - cpu) <= 1e-12 * cpu);
        REQUIRE(b.gpu->sum_of_squares(g.gpu, n) == gpu);  // the same order every time
        b.cpu->scale(g.cpu, n, 0.5f);
        b.gpu->scale(g.gpu, n, 0.5f);
        require_close(g, t, "scale");
        for (DType p : kTypes) {
            INFO("grads " << name(t) << ", params " << name(p));
            Pair master(b, n, DType::f32), m(b, n, DType::f32), v(b, n, DType::f32),
                params(b, n, p);
            master.fill(2, 0.02f);
            m.fill(3, 0.001f);
            std::vector<float> vv(n);
            for (std::size_t i = 0; i < n; ++i) vv[i] = 1e-6f * static_cast<float>(1 + i % 7);
            v.set(vv);
            for (int step = 1; step <= 2; ++step) {
                b.cpu->adamw_update(master.cpu.f32(), g.cpu, m.cpu.f32(), v.cpu.f32(), n, 6e-4f,
                                    0.9f, 0.95f, 1e-8f, 0.1f, step, 0.7f, params.cpu);
                b.gpu->adamw_update(master.gpu.f32(), g.gpu, m.gpu.f32(), v.gpu.f32(), n, 6e-4f,
                                    0.9f, 0.95f, 1e-8f, 0.1f, step, 0.7f, params.gpu);
            }
            require_close(master, DType::f32, "adamw master");
            require_close(m, DType::f32, "adamw m");
            require_close(v, DType::f32, "adamw v");
            require_close(params, p, "adamw params");
        }
    }
    // Totals on the device: the norm over two buffers and the loss over two microbatches.
    Pair g(b, n, DType::bf16), losses(b, 4096, DType::f32);
    g.fill(4, 0.01f);
    losses.fill(5, 1.0f, 10.0f);
    std::vector<double> totals;
    for (Ops* ops : {b.cpu.get(), b.gpu.get()}) {
        const bool gpu = ops == b.gpu.get();
        const Ptr norm = ops->allocate(1, DType::f64), loss = ops->allocate(1, DType::f64);
        for (std::size_t half : {std::size_t{0}, n / 2})
            ops->add_sum_of_squares(static_cast<double*>(norm.data), (gpu ? g.gpu : g.cpu) + half,
                                    half ? n - half : n / 2);
        for (int mb = 0; mb < 2; ++mb)
            ops->add_mean(static_cast<double*>(loss.data), (gpu ? losses.gpu : losses.cpu).f32(),
                          4096 - 1000 * mb);
        for (Ptr total : {norm, loss}) {
            totals.push_back(0.0);
            ops->download(&totals.back(), total.data, sizeof(double));
            ops->release(total.data);
        }
    }
    INFO("norm " << totals[2] << " against " << totals[0] << ", loss " << totals[3] << " against "
                 << totals[1]);
    REQUIRE(std::abs(totals[2] - totals[0]) <= 1e-12 * totals[0]);
    REQUIRE(totals[1] > 19.0);  // two means near 10
    REQUIRE(std::abs(totals[3] - totals[1]) <= 1e-6 * totals[1]);

    // Inf and NaN reach the norm.
    Pair bad(b, 1000, DType::bf16);
    std::vector<float> values(1000, 1.0f);
    values[500] = std::numeric_limits<float>::infinity();
    bad.set(values);
    REQUIRE(std::isinf(b.gpu->sum_of_squares(bad.gpu, 1000)));
    values[600] = std::numeric_limits<float>::quiet_NaN();
    bad.set(values);
    REQUIRE(std::isnan(b.gpu->sum_of_squares(bad.gpu, 1000)));
}

TEST_CASE("cuda: attention against a key/value cache, grouped heads", "[ops]") {
    Backends b;
    struct Case {
        int rows, first, NH, KVH, hs, seq_len;
    };
    // A prefill from position 0, one-row steps further on, a group of 1 (GPT-2), and rows past
    // 12,160 positions, whose scores need more than 48 KiB of shared memory.
    for (const Case& k :
         {Case{9, 0, 4, 2, 16, 32}, Case{1, 20, 4, 2, 16, 32}, Case{1, 300, 6, 1, 32, 512},
          Case{3, 5, 4, 4, 8, 16}, Case{2, 13000, 2, 1, 16, 13002}}) {
        INFO("rows " << k.rows << " first " << k.first << " NH " << k.NH << " KVH " << k.KVH);
        const std::size_t channels = std::size_t(k.NH) * k.hs;
        const std::size_t cache = std::size_t(k.seq_len) * k.KVH * k.hs;
        Pair qkv(b, k.rows * 3 * channels, DType::f32), out(b, k.rows * channels, DType::f32);
        Pair keys(b, cache, DType::f32), values(b, cache, DType::f32);
        qkv.fill(1);
        keys.fill(2);  // positions before `first`: earlier tokens'
        values.fill(3);
        b.cpu->cached_attention_forward(out.cpu, keys.cpu, values.cpu, qkv.cpu, k.rows, k.first,
                                        k.NH, k.KVH, k.hs);
        b.gpu->cached_attention_forward(out.gpu, keys.gpu, values.gpu, qkv.gpu, k.rows, k.first,
                                        k.NH, k.KVH, k.hs);
        require_within(out.on_gpu(), out.on_cpu(), tolerance(DType::f32),
                       "cached_attention_forward");
        require_within(keys.on_gpu(), keys.on_cpu(), 0.0, "the cache's keys");
        require_within(values.on_gpu(), values.on_cpu(), 0.0, "the cache's values");
    }
    // Past what a block's shared memory can hold on any GPU (64,000 positions: 250 KiB): an
    // error naming the limit, not a failed launch.
    const int seq_len = 64001, hs = 8;
    Pair qkv(b, 3 * hs, DType::f32), out(b, hs, DType::f32),
        keys(b, std::size_t(seq_len) * hs, DType::f32),
        values(b, std::size_t(seq_len) * hs, DType::f32);
    try {
        b.gpu->cached_attention_forward(out.gpu, keys.gpu, values.gpu, qkv.gpu, 1, 64000, 1, 1, hs);
        FAIL("64,001 cached positions were accepted");
    } catch (const trident::Error& e) {
        INFO(e.what());
        REQUIRE(std::string(e.what()).find("positions") != std::string::npos);
    }
}
