// trident_document_attention_bench: times the CPU's attention within packed documents
// (Ops::document_attention_forward and _backward, kernels/cpu/attention.cpp) against one causal
// window (attention_forward and _backward) at the same sizes, on the CPU backend's threads.
// For docs/PERF.md's figure of the work the masked blocks save.
//
//   trident_document_attention_bench [--batch B] [--seq T] [--channels C] [--heads NH]
//                                    [--documents K] [--repeat R] [--threads N]
//
// Each window holds K documents of T/K tokens. Prints one JSON line: the best of R passes
// (after one untimed) of forward plus backward, in milliseconds, for the causal window and for
// the documents, and their ratio.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

#include "kernels/ops.h"
#include "kernels/random.h"

using namespace trident;

namespace {

std::vector<float> hashed(std::size_t count, uint64_t seed) {
    std::vector<float> x(count);
    for (std::size_t i = 0; i < count; ++i)
        x[i] = static_cast<float>(kernels::hash64(seed, i) % 2001) / 1000.0f - 1.0f;
    return x;
}

// The best of `repeat` timed passes of `pass`, after one untimed, in milliseconds.
double best_ms(int repeat, const std::function<void()>& pass) {
    pass();
    double best = 1e300;
    for (int r = 0; r < repeat; ++r) {
        const auto start = std::chrono::steady_clock::now();
        pass();
        const std::chrono::duration<double, std::milli> took =
            std::chrono::steady_clock::now() - start;
        best = std::min(best, took.count());
    }
    return best;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Times the CPU's attention within packed documents against a causal window"};
    int B = 4, T = 1024, C = 768, NH = 12, K = 8, repeat = 5, threads = 1;
    app.add_option("--batch", B, "Sequences");
    app.add_option("--seq", T, "Tokens a window");
    app.add_option("--channels", C, "Channels (heads x head size)");
    app.add_option("--heads", NH, "Heads");
    app.add_option("--documents", K, "Documents a window, of T/K tokens each");
    app.add_option("--repeat", repeat, "Timed passes (the best is printed)");
    app.add_option("--threads", threads, "CPU backend threads");
    CLI11_PARSE(app, argc, argv);
    auto ops = kernels::make_cpu_ops(threads);
    const std::size_t rows = static_cast<std::size_t>(B) * T;
    const auto qkv = hashed(rows * 3 * C, 1), dout = hashed(rows * C, 2);
    std::vector<float> out(rows * C), dqkv(rows * 3 * C);
    std::vector<float> att(ops->attention_saved(B, NH, T, kernels::DType::f32).count);
    std::vector<int32_t> starts(rows);
    for (std::size_t n = 0; n < rows; ++n) {
        const int t = static_cast<int>(n % T), length = std::max(1, T / K);
        starts[n] = t / length * length;
    }
    const double causal = best_ms(repeat, [&] {
        ops->attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, 0.0f, 0, 0, NH);
        ops->attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), att.data(), B, T,
                                C, NH, 0.0f, 0, 0, NH);
    });
    const double documents = best_ms(repeat, [&] {
        ops->document_attention_forward(out.data(), att.data(), qkv.data(), starts.data(), B, T, C,
                                        NH, 0.0f, 0, 0, NH);
        ops->document_attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(),
                                         att.data(), starts.data(), B, T, C, NH, 0.0f, 0, 0, NH);
    });
    std::printf(
        "{\"batch\": %d, \"seq\": %d, \"channels\": %d, \"heads\": %d, \"documents\": %d, "
        "\"threads\": %d, \"causal_ms\": %.3f, \"documents_ms\": %.3f, \"ratio\": %.4f}\n",
        B, T, C, NH, K, threads, causal, documents, documents / causal);
    return 0;
}
