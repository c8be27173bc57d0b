// The GPU backend's ops in the forms the model's split backward and its optimizer call them,
// against the CPU backend: LayerNorm's and the linear's backward as an input step and a weight
// step, AdamW without a working copy; and uploads, which return without waiting for the GPU:
// in order with the ops around them, a large one in pieces, many in a row.
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/cuda/backends.h"

using namespace gpu_test;

namespace {

const DType kTypes[] = {DType::f32, DType::bf16, DType::f16};

}  // namespace

TEST_CASE("cuda: backward split into an input step and a weight step", "[ops]") {
    Backends b;
    const int N = 67, channels = 120, OC = 88;
    for (DType t : kTypes) {
        INFO(name(t));
        Pair inp(b, std::size_t(N) * channels, t), w(b, channels, t), bias(b, channels, t),
            out(b, inp.count, t);
        inp.fill(1, 2.0f, 0.5f);
        w.fill(2, 0.2f, 1.0f);
        bias.fill(3, 0.1f);
        Pair mean(b, N, DType::f32), rstd(b, N, DType::f32);
        b.cpu->layernorm_forward(out.cpu, mean.cpu.f32(), rstd.cpu.f32(), inp.cpu, w.cpu, bias.cpu,
                                 N, channels);
        b.gpu->layernorm_forward(out.gpu, mean.gpu.f32(), rstd.gpu.f32(), inp.gpu, w.gpu, bias.gpu,
                                 N, channels);
        Pair dout(b, inp.count, t), dinp(b, inp.count, t), dw(b, channels, DType::f32),
            db(b, channels, DType::f32);
        dout.fill(4);
        dinp.fill(5, 0.1f);
        dw.fill(6, 0.1f);
        db.fill(7, 0.1f);
        for (Ops* ops : {b.cpu.get(), b.gpu.get()}) {
            const bool gpu = ops == b.gpu.get();
            const auto on = [&](const Pair& p) { return gpu ? p.gpu : p.cpu; };
            ops->layernorm_backward(on(dinp), Ptr(), Ptr(), on(dout), on(inp), on(w),
                                    (gpu ? mean.gpu : mean.cpu).f32(),
                                    (gpu ? rstd.gpu : rstd.cpu).f32(), N, channels);
            ops->layernorm_backward(Ptr(), on(dw), on(db), on(dout), on(inp), on(w),
                                    (gpu ? mean.gpu : mean.cpu).f32(),
                                    (gpu ? rstd.gpu : rstd.cpu).f32(), N, channels);
        }
        require_close(dinp, t, "layernorm_backward, input step");
        require_close(dw, DType::f32, "layernorm_backward, weight step: dweight");
        require_close(db, DType::f32, "layernorm_backward, weight step: dbias");

        Pair weight(b, std::size_t(OC) * channels, t), mdout(b, std::size_t(N) * OC, t),
            mdinp(b, inp.count, t), mdw(b, weight.count, t), mdb(b, OC, t);
        weight.fill(8, 0.1f);
        mdout.fill(9);
        mdinp.fill(10, 0.1f);
        mdw.fill(11, 0.1f);
        mdb.fill(12, 0.1f);
        for (Ops* ops : {b.cpu.get(), b.gpu.get()}) {
            const bool gpu = ops == b.gpu.get();
            const auto on = [&](const Pair& p) { return gpu ? p.gpu : p.cpu; };
            ops->matmul_backward(on(mdinp), Ptr(), Ptr(), on(mdout), on(inp), on(weight), N,
                                 channels, OC);
            ops->matmul_backward(Ptr(), Ptr(), on(mdb), on(mdout), on(inp), on(weight), N, channels,
                                 OC);
            ops->matmul_backward(Ptr(), on(mdw), Ptr(), on(mdout), on(inp), on(weight), N, channels,
                                 OC);
        }
        require_close(mdinp, t, "matmul_backward, input step");
        require_close(mdb, t, "matmul_backward, dbias alone");
        require_close(mdw, t, "matmul_backward, weight step");
    }
}

TEST_CASE("cuda: AdamW without a working copy of the weights", "[ops]") {
    Backends b;
    const std::size_t n = 5003;
    Pair master(b, n, DType::f32), g(b, n, DType::bf16), m(b, n, DType::f32), v(b, n, DType::f32);
    master.fill(1, 0.02f);
    g.fill(2, 0.01f);
    m.fill(3, 0.001f);
    v.set(std::vector<float>(n, 1e-6f));
    b.cpu->adamw_update(master.cpu.f32(), g.cpu, m.cpu.f32(), v.cpu.f32(), n, 1e-3f, 0.9f, 0.95f,
                        1e-8f, 0.1f, 3, 1.0f, Ptr());
    b.gpu->adamw_update(master.gpu.f32(), g.gpu, m.gpu.f32(), v.gpu.f32(), n, 1e-3f, 0.9f, 0.95f,
                        1e-8f, 0.1f, 3, 1.0f, Ptr());
    require_close(master, DType::f32, "adamw master, no params");
    require_close(m, DType::f32, "adamw m, no params");
    require_close(v, DType::f32, "adamw v, no params");
}

TEST_CASE("cuda: uploads keep the order of the ops around them and need no wait", "[ops]") {
    Backends b;
    Ops& gpu = *b.gpu;
    // A buffer uploaded, copied by an op, and uploaded again before anything is read back: the
    // copy sees the first upload and the buffer ends with the second.
    const std::size_t n = 3000;
    const std::vector<int32_t> first = random_tokens(n, 1 << 30, 1),
                               second = random_tokens(n, 1 << 30, 2);
    const Ptr x = gpu.allocate(n, DType::f32), y = gpu.allocate(n, DType::f32);
    gpu.upload(x.data, first.data(), n * sizeof(int32_t));
    gpu.copy(y, x, n);
    gpu.upload(x.data, second.data(), n * sizeof(int32_t));
    std::vector<int32_t> got(n);
    gpu.download(got.data(), y.data, n * sizeof(int32_t));
    require_equal(got, first, "the copy queued between two uploads");
    gpu.download(got.data(), x.data, n * sizeof(int32_t));
    require_equal(got, second, "the second upload");
    gpu.release(x.data);
    gpu.release(y.data);

    // More uploads in a row than the staging has slots, each from a host buffer reused at once.
    std::vector<Ptr> targets;
    std::vector<int32_t> host(777);
    for (int i = 0; i < 40; ++i) {
        targets.push_back(gpu.allocate(host.size(), DType::f32));
        host = random_tokens(host.size(), 1 << 30, 100 + static_cast<uint64_t>(i));
        gpu.upload(targets.back().data, host.data(), host.size() * sizeof(int32_t));
    }
    for (int i = 0; i < 40; ++i) {
        std::vector<int32_t> back(host.size());
        gpu.download(back.data(), targets[static_cast<std::size_t>(i)].data,
                     back.size() * sizeof(int32_t));
        require_equal(back, random_tokens(host.size(), 1 << 30, 100 + static_cast<uint64_t>(i)),
                      "upload " + std::to_string(i) + " of 40");
        gpu.release(targets[static_cast<std::size_t>(i)].data);
    }

    // One upload larger than all the slots together (the weights at start-up), not a whole
    // number of slots.
    const std::vector<int32_t> large = random_tokens((std::size_t{20} << 20) / 4 + 37, 1 << 30, 3);
    const Ptr big = gpu.allocate(large.size(), DType::f32);
    gpu.upload(big.data, large.data(), large.size() * sizeof(int32_t));
    std::vector<int32_t> back(large.size());
    gpu.download(back.data(), big.data, back.size() * sizeof(int32_t));
    require_equal(back, large, "an upload of 20 MiB");
    gpu.release(big.data);
}
