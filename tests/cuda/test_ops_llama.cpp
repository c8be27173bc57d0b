// Llama's ops on the GPU against the CPU backend on random inputs, in fp32, bf16 and fp16
// (backends.h's tolerances), forward and backward: RMSNorm (its weight gradient in the
// activations' type and in fp32, each part of a split backward alone, bit for bit run to run),
// rotary positions with grouped key/value heads (multi-head, grouped and one key/value head;
// positions from 0, at a context-parallel rank's offset, and far into a long sequence) and
// SwiGLU (rows of whole packs and of single elements); and each with mixed element types (the
// fp32 views).
#include <catch2/catch.hpp>
#include <vector>

#include "tests/cuda/backends.h"

using namespace gpu_test;

namespace {

const DType kTypes[] = {DType::f32, DType::bf16, DType::f16};

// The sequence positions of T rows on each backend, as the model keeps them (int32 on the
// device).
struct Positions {
    Tokens ids;
    Positions(Backends& b, int first, int T) : ids(b, sequence(first, T)) {}
    static std::vector<int32_t> sequence(int first, int T) {
        std::vector<int32_t> p(static_cast<std::size_t>(T));
        for (int t = 0; t < T; ++t) p[static_cast<std::size_t>(t)] = first + t;
        return p;
    }
};

}  // namespace

TEST_CASE("cuda: RMSNorm forward and backward", "[ops]") {
    Backends b;
    const int N = 67,
              channels = 300;  // 3 chunks of rows; a partial block of rows; channels % 32 != 0
    const float eps = 1e-5f;
    for (DType t : kTypes) {
        for (DType g : {t, DType::f32}) {
            INFO("activations " << name(t) << ", gradients " << name(g));
            Pair inp(b, std::size_t(N) * channels, t), w(b, channels, t), out(b, inp.count, t);
            inp.fill(1, 2.0f, 0.5f);
            w.fill(2, 0.2f, 1.0f);
            Pair rstd(b, N, DType::f32);
            b.cpu->rmsnorm_forward(out.cpu, rstd.cpu.f32(), inp.cpu, w.cpu, N, channels, eps);
            b.gpu->rmsnorm_forward(out.gpu, rstd.gpu.f32(), inp.gpu, w.gpu, N, channels, eps);
            require_close(out, t, "rmsnorm_forward out");
            require_close(rstd, DType::f32, "rmsnorm_forward rstd");
            Pair dout(b, out.count, t), dinp(b, out.count, t), dw(b, channels, g);
            dout.fill(4);
            dinp.fill(5, 0.1f);
            dw.fill(6, 0.1f);
            b.cpu->rmsnorm_backward(dinp.cpu, dw.cpu, dout.cpu, inp.cpu, w.cpu, rstd.cpu.f32(), N,
                                    channels);
            b.gpu->rmsnorm_backward(dinp.gpu, dw.gpu, dout.gpu, inp.gpu, w.gpu, rstd.gpu.f32(), N,
                                    channels);
            require_close(dinp, t, "rmsnorm_backward dinp");
            require_close(dw, g, "rmsnorm_backward dweight");
            // The split backward's steps: the input's gradient alone, then the weight's alone.
            b.cpu->rmsnorm_backward(dinp.cpu, Ptr(), dout.cpu, inp.cpu, w.cpu, rstd.cpu.f32(), N,
                                    channels);
            b.gpu->rmsnorm_backward(dinp.gpu, Ptr(), dout.gpu, inp.gpu, w.gpu, rstd.gpu.f32(), N,
                                    channels);
            require_close(dinp, t, "rmsnorm_backward dinp alone");
            require_close(dw, g, "rmsnorm_backward dweight untouched");
            b.cpu->rmsnorm_backward(Ptr(), dw.cpu, dout.cpu, inp.cpu, w.cpu, rstd.cpu.f32(), N,
                                    channels);
            b.gpu->rmsnorm_backward(Ptr(), dw.gpu, dout.gpu, inp.gpu, w.gpu, rstd.gpu.f32(), N,
                                    channels);
            require_close(dw, g, "rmsnorm_backward dweight alone");
            // The weight's gradient repeats bit for bit (column sums in a fixed order).
            b.gpu->zero(dw.gpu, channels);
            b.gpu->rmsnorm_backward(Ptr(), dw.gpu, dout.gpu, inp.gpu, w.gpu, rstd.gpu.f32(), N,
                                    channels);
            const std::vector<float> once = dw.on_gpu();
            b.gpu->zero(dw.gpu, channels);
            b.gpu->rmsnorm_backward(Ptr(), dw.gpu, dout.gpu, inp.gpu, w.gpu, rstd.gpu.f32(), N,
                                    channels);
            REQUIRE(dw.on_gpu() == once);
        }
    }
}

TEST_CASE("cuda: rotary positions with grouped key/value heads, forward and backward", "[ops]") {
    Backends b;
    const int B = 2, T = 9, NH = 6, hs = 16;
    const float theta = 10000.0f;
    for (DType t : kTypes) {
        for (int KVH : {6, 2, 1}) {
            // From 0 (null), at the offset of a context-parallel rank's rows, and far into a
            // long sequence (angles of 10^5 radians, Llama-3's 128k context).
            for (int first : {-1, 40, 131000}) {
                INFO(name(t) << ", " << NH << " query heads, " << KVH << " key/value heads, first "
                             << "position " << (first < 0 ? 0 : first));
                const Positions positions(b, first < 0 ? 0 : first, T);
                const int32_t* on_cpu = first < 0 ? nullptr : positions.ids.on_cpu();
                const int32_t* on_gpu = first < 0 ? nullptr : positions.ids.on_gpu();
                const std::size_t rows = std::size_t(B) * T;
                Pair qkv(b, rows * (NH + 2 * KVH) * hs, t), out(b, rows * 3 * NH * hs, t);
                qkv.fill(1);
                b.cpu->rotary_qkv_forward(out.cpu, qkv.cpu, B, T, NH, KVH, hs, theta, on_cpu);
                b.gpu->rotary_qkv_forward(out.gpu, qkv.gpu, B, T, NH, KVH, hs, theta, on_gpu);
                require_close(out, t, "rotary_qkv_forward");
                Pair dout(b, out.count, t), dqkv(b, qkv.count, t);
                dout.fill(2);
                dqkv.fill(3, 0.1f);
                b.cpu->rotary_qkv_backward(dqkv.cpu, dout.cpu, B, T, NH, KVH, hs, theta, on_cpu);
                b.gpu->rotary_qkv_backward(dqkv.gpu, dout.gpu, B, T, NH, KVH, hs, theta, on_gpu);
                require_close(dqkv, t, "rotary_qkv_backward");
            }
        }
    }
}

TEST_CASE("cuda: SwiGLU forward and backward", "[ops]") {
    Backends b;
    const int N = 37;
    for (DType t : kTypes) {
        // 64: rows of whole 16-byte packs; 30: single elements.
        for (int F : {64, 30}) {
            INFO(name(t) << ", width " << F);
            Pair inp(b, std::size_t(N) * 2 * F, t), out(b, std::size_t(N) * F, t);
            inp.fill(1, 3.0f);  // gates far into both tails of the sigmoid
            b.cpu->swiglu_forward(out.cpu, inp.cpu, N, F);
            b.gpu->swiglu_forward(out.gpu, inp.gpu, N, F);
            require_close(out, t, "swiglu_forward");
            Pair dout(b, out.count, t), dinp(b, inp.count, t);
            dout.fill(2);
            dinp.fill(3, 0.1f);
            b.cpu->swiglu_backward(dinp.cpu, inp.cpu, dout.cpu, N, F);
            b.gpu->swiglu_backward(dinp.gpu, inp.gpu, dout.gpu, N, F);
            require_close(dinp, t, "swiglu_backward");
        }
    }
}

// Arguments of mixed types go through the fp32 views: bf16 activations with an fp32 weight
// or an fp32 output. An fp32 output from the same bf16 inputs is held to fp32's tolerance.
TEST_CASE("cuda: Llama's ops with mixed element types", "[ops]") {
    Backends b;
    const DType h = DType::bf16, f = DType::f32;
    const int N = 20, channels = 48, B = 2, T = 10, NH = 4, KVH = 2, hs = 12;
    Pair inp(b, std::size_t(N) * channels, h), w(b, channels, f), out(b, inp.count, h),
        rstd(b, N, f);
    inp.fill(1);
    w.fill(2, 0.2f, 1.0f);
    b.cpu->rmsnorm_forward(out.cpu, rstd.cpu.f32(), inp.cpu, w.cpu, N, channels, 1e-6f);
    b.gpu->rmsnorm_forward(out.gpu, rstd.gpu.f32(), inp.gpu, w.gpu, N, channels, 1e-6f);
    require_close(out, h, "rmsnorm_forward, fp32 weight");
    Pair dout(b, out.count, h), dinp(b, out.count, h), dw(b, channels, f);
    dout.fill(3);
    b.cpu->rmsnorm_backward(dinp.cpu, dw.cpu, dout.cpu, inp.cpu, w.cpu, rstd.cpu.f32(), N,
                            channels);
    b.gpu->rmsnorm_backward(dinp.gpu, dw.gpu, dout.gpu, inp.gpu, w.gpu, rstd.gpu.f32(), N,
                            channels);
    require_close(dinp, h, "rmsnorm_backward dinp, fp32 weight");
    require_close(dw, f, "rmsnorm_backward dweight, fp32 weight");

    const std::size_t rows = std::size_t(B) * T;
    Pair qkv(b, rows * (NH + 2 * KVH) * hs, h), rotated(b, rows * 3 * NH * hs, f);
    qkv.fill(4);
    b.cpu->rotary_qkv_forward(rotated.cpu, qkv.cpu, B, T, NH, KVH, hs, 500000.0f, nullptr);
    b.gpu->rotary_qkv_forward(rotated.gpu, qkv.gpu, B, T, NH, KVH, hs, 500000.0f, nullptr);
    require_close(rotated, f, "rotary_qkv_forward into fp32");
    Pair dqkv(b, qkv.count, f);
    b.cpu->rotary_qkv_backward(dqkv.cpu, rotated.cpu, B, T, NH, KVH, hs, 500000.0f, nullptr);
    b.gpu->rotary_qkv_backward(dqkv.gpu, rotated.gpu, B, T, NH, KVH, hs, 500000.0f, nullptr);
    require_close(dqkv, f, "rotary_qkv_backward into fp32");

    Pair gate_up(b, std::size_t(N) * 2 * channels, h), act(b, std::size_t(N) * channels, f);
    gate_up.fill(5, 2.0f);
    b.cpu->swiglu_forward(act.cpu, gate_up.cpu, N, channels);
    b.gpu->swiglu_forward(act.gpu, gate_up.gpu, N, channels);
    require_close(act, f, "swiglu_forward into fp32");
    Pair d_gate_up(b, gate_up.count, f);
    b.cpu->swiglu_backward(d_gate_up.cpu, gate_up.cpu, act.cpu, N, channels);
    b.gpu->swiglu_backward(d_gate_up.gpu, gate_up.gpu, act.gpu, N, channels);
    require_close(d_gate_up, f, "swiglu_backward into fp32");
}
