// Tests of the CPU backend's op set (kernels/ops.h).
//
// Every forward op is checked against a plain-loop reference written here, templated on the
// scalar type and run in double. Every backward op is checked against central finite
// differences of that double reference, on the objective L = sum(dout * forward(x)) for a
// random dout, so the gradients are tested against the forward's definition rather than
// against a second hand-derived formula. The rest covers the "+=" convention, dropout's
// statistics, AdamW against a hand-computed double loop, bitwise determinism, and the CPU
// backend's own exp approximation.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ops.h"

namespace {

using trident::kernels::dropout_keep;
using trident::kernels::make_cpu_ops;

// ---- helpers ------------------------------------------------------------------------------

std::vector<float> random_floats(std::size_t count, uint32_t seed, float lo = -1.0f,
                                 float hi = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> x(count);
    for (float& value : x) value = dist(rng);
    return x;
}

std::vector<int32_t> random_ints(std::size_t count, uint32_t seed, int32_t bound) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> dist(0, bound - 1);
    std::vector<int32_t> x(count);
    for (int32_t& value : x) value = dist(rng);
    return x;
}

std::vector<double> to_double(const std::vector<float>& x) {
    return {x.begin(), x.end()};
}

// Passes when max |actual - expected| <= tolerance * max |expected|: an error measured
// against the tensor's scale, so near-zero elements do not demand impossible precision.
void check_close(const char* what, const std::vector<float>& actual,
                 const std::vector<double>& expected, double tolerance) {
    REQUIRE(actual.size() == expected.size());
    double scale = 0.0;
    double error = 0.0;
    for (std::size_t i = 0; i < actual.size(); i++) {
        scale = std::max(scale, std::abs(expected[i]));
        error = std::max(error, std::abs(actual[i] - expected[i]));
    }
    INFO(what << ": max error " << error << ", max |expected| " << scale);
    CHECK(error <= tolerance * std::max(scale, 1e-30));
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Central finite differences of objective() with respect to every element of x, which the
// objective reads by reference.
template <typename Objective>
std::vector<double> numeric_gradient(Objective&& objective, std::vector<double>& x) {
    constexpr double kStep = 1e-6;
    std::vector<double> gradient(x.size());
    for (std::size_t i = 0; i < x.size(); i++) {
        const double saved = x[i];
        x[i] = saved + kStep;
        const double plus = objective();
        x[i] = saved - kStep;
        const double minus = objective();
        x[i] = saved;
        gradient[i] = (plus - minus) / (2.0 * kStep);
    }
    return gradient;
}

std::vector<double> doubled(std::vector<double> x) {
    for (double& value : x) value *= 2.0;
    return x;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
    double sum = 0.0;
    for (std::size_t i = 0; i < a.size(); i++) sum += a[i] * b[i];
    return sum;
}

constexpr double kForwardTolerance = 1e-5;
constexpr double kGradientTolerance = 1e-4;

// ---- plain-loop references --------------------------------------------------------------

template <typename T>
void embedding_reference(std::vector<T>& out, const std::vector<int32_t>& tokens,
                         const std::vector<T>& wte, const std::vector<T>& wpe, int B, int Tn,
                         int C) {
    out.assign(static_cast<std::size_t>(B) * Tn * C, T(0));
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tn; t++)
            for (int c = 0; c < C; c++)
                out[(b * Tn + t) * C + c] = wte[tokens[b * Tn + t] * C + c] + wpe[t * C + c];
}

template <typename T>
void layernorm_reference(std::vector<T>& out, const std::vector<T>& inp,
                         const std::vector<T>& weight, const std::vector<T>& bias, int N, int C) {
    out.assign(static_cast<std::size_t>(N) * C, T(0));
    for (int n = 0; n < N; n++) {
        T mean = 0;
        for (int c = 0; c < C; c++) mean += inp[n * C + c];
        mean /= C;
        T var = 0;
        for (int c = 0; c < C; c++) var += (inp[n * C + c] - mean) * (inp[n * C + c] - mean);
        var /= C;
        const T rstd = T(1) / std::sqrt(var + T(1e-5));
        for (int c = 0; c < C; c++)
            out[n * C + c] = (inp[n * C + c] - mean) * rstd * weight[c] + bias[c];
    }
}

template <typename T>
void matmul_reference(std::vector<T>& out, const std::vector<T>& inp, const std::vector<T>& weight,
                      const std::vector<T>* bias, int N, int C, int OC) {
    out.assign(static_cast<std::size_t>(N) * OC, T(0));
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            T sum = bias != nullptr ? (*bias)[o] : T(0);
            for (int c = 0; c < C; c++) sum += inp[n * C + c] * weight[o * C + c];
            out[n * OC + o] = sum;
        }
}

// att (B,NH,Tn,Tn) and out (B,Tn,C), attention dropout by the flat index into att.
template <typename T>
void attention_reference(std::vector<T>& out, std::vector<T>& att, const std::vector<T>& qkv, int B,
                         int Tn, int C, int NH, float drop_prob, uint64_t seed) {
    const int hs = C / NH;
    const T scale = T(1) / std::sqrt(T(hs));
    const T keep_scale = T(1) / (T(1) - T(drop_prob));
    out.assign(static_cast<std::size_t>(B) * Tn * C, T(0));
    att.assign(static_cast<std::size_t>(B) * NH * Tn * Tn, T(0));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < Tn; t++) {
                const T* q = &qkv[(b * Tn + t) * 3 * C + h * hs];
                T* row = &att[((b * NH + h) * Tn + t) * Tn];
                T max = -std::numeric_limits<T>::infinity();
                for (int j = 0; j <= t; j++) {
                    const T* k = &qkv[(b * Tn + j) * 3 * C + C + h * hs];
                    T score = 0;
                    for (int i = 0; i < hs; i++) score += q[i] * k[i];
                    row[j] = score * scale;
                    max = std::max(max, row[j]);
                }
                T sum = 0;
                for (int j = 0; j <= t; j++) {
                    row[j] = std::exp(row[j] - max);
                    sum += row[j];
                }
                for (int j = 0; j <= t; j++) row[j] /= sum;
                for (int j = 0; j <= t; j++) {
                    const std::size_t index = ((b * NH + h) * Tn + t) * Tn + j;
                    const T p = dropout_keep(seed, index, drop_prob) ? row[j] * keep_scale : T(0);
                    const T* v = &qkv[(b * Tn + j) * 3 * C + 2 * C + h * hs];
                    for (int i = 0; i < hs; i++) out[(b * Tn + t) * C + h * hs + i] += p * v[i];
                }
            }
}

template <typename T>
T gelu_reference(T x) {
    const T sqrt_2_over_pi = std::sqrt(T(2) / T(3.14159265358979323846));
    return T(0.5) * x * (T(1) + std::tanh(sqrt_2_over_pi * (x + T(0.044715) * x * x * x)));
}

template <typename T>
void dropout_reference(std::vector<T>& out, const std::vector<T>& inp, float drop_prob,
                       uint64_t seed) {
    out.resize(inp.size());
    for (std::size_t i = 0; i < inp.size(); i++)
        out[i] = dropout_keep(seed, i, drop_prob) ? inp[i] / (T(1) - T(drop_prob)) : T(0);
}

template <typename T>
void cross_entropy_reference(std::vector<T>& losses, const std::vector<T>& logits,
                             const std::vector<int32_t>& targets, int N, int V, int Vp) {
    losses.assign(N, T(0));
    for (int n = 0; n < N; n++) {
        T max = logits[n * Vp];
        for (int c = 0; c < V; c++) max = std::max(max, logits[n * Vp + c]);
        T sum = 0;
        for (int c = 0; c < V; c++) sum += std::exp(logits[n * Vp + c] - max);
        losses[n] = max + std::log(sum) - logits[n * Vp + targets[n]];
    }
}

// ---- the CPU backend's vectorisable exp and tanh -----------------------------------------

TEST_CASE("fast_exp and fast_tanh are accurate", "[kernels]") {
    using trident::kernels::cpu::fast_exp;
    using trident::kernels::cpu::fast_tanh;
    double exp_error = 0.0;  // relative
    for (double x = -87.0; x <= 88.0; x += 1e-3) {
        const float xf = static_cast<float>(x);
        const double exact = std::exp(static_cast<double>(xf));
        exp_error = std::max(exp_error, std::abs(fast_exp(xf) - exact) / exact);
    }
    CHECK(exp_error < 5e-7);
    CHECK(fast_exp(0.0f) == 1.0f);
    CHECK(fast_exp(-100.0f) == 0.0f);
    CHECK(fast_exp(-std::numeric_limits<float>::infinity()) == 0.0f);

    double tanh_error = 0.0;  // absolute
    for (double x = -20.0; x <= 20.0; x += 1e-3) {
        const float xf = static_cast<float>(x);
        tanh_error = std::max(tanh_error, std::abs(fast_tanh(xf) - std::tanh(double(xf))));
    }
    CHECK(tanh_error < 5e-7);
}

// ---- memory -------------------------------------------------------------------------------

TEST_CASE("cpu ops: allocate is zeroed and aligned, copies round-trip", "[kernels]") {
    auto ops = make_cpu_ops(2);
    const std::size_t count = 1000;
    float* buffer = ops->allocate(count);
    REQUIRE(buffer != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(buffer) % 64 == 0);
    CHECK(std::all_of(buffer, buffer + count, [](float x) { return x == 0.0f; }));

    const auto host = random_floats(count, 1);
    ops->copy_from_host(buffer, host.data(), count);
    float* other = ops->allocate(count);
    ops->copy(other, buffer, count);
    std::vector<float> back(count);
    ops->copy_to_host(back.data(), other, count);
    CHECK(bitwise_equal(back, host));

    ops->zero(other, count);
    CHECK(std::all_of(other, other + count, [](float x) { return x == 0.0f; }));
    ops->release(buffer);
    ops->release(other);
    CHECK(std::string(ops->name()) == "cpu");
}

// ---- embedding ----------------------------------------------------------------------------

TEST_CASE("embedding forward and backward", "[kernels]") {
    auto ops = make_cpu_ops(2);
    const int B = 2, Tn = 5, Vp = 16;
    const int C = GENERATE(8, 80);  // 80: more than one of the backward's channel blocks
    // Repeated tokens, within and across sequences, make the backward a true reduction.
    const std::vector<int32_t> tokens = {3, 7, 3, 0, 15, 7, 7, 2, 3, 9};
    const auto wte = random_floats(Vp * C, 11);
    const auto wpe = random_floats(Tn * C, 12);

    std::vector<float> out(B * Tn * C);
    ops->embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, Tn, C);
    std::vector<double> expected;
    embedding_reference(expected, tokens, to_double(wte), to_double(wpe), B, Tn, C);
    check_close("out", out, expected, kForwardTolerance);

    const auto dout = random_floats(B * Tn * C, 13);
    std::vector<float> dwte(Vp * C, 0.0f), dwpe(Tn * C, 0.0f);
    ops->embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, Tn, C);

    auto wte_d = to_double(wte), wpe_d = to_double(wpe);
    const auto dout_d = to_double(dout);
    auto objective = [&] {
        std::vector<double> y;
        embedding_reference(y, tokens, wte_d, wpe_d, B, Tn, C);
        return dot(y, dout_d);
    };
    const auto dwte_expected = numeric_gradient(objective, wte_d);
    const auto dwpe_expected = numeric_gradient(objective, wpe_d);
    check_close("dwte", dwte, dwte_expected, kGradientTolerance);
    check_close("dwpe", dwpe, dwpe_expected, kGradientTolerance);

    // "+=": a second call on top of the first doubles the gradients.
    ops->embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, Tn, C);
    check_close("dwte", dwte, doubled(dwte_expected), kGradientTolerance);
    check_close("dwpe", dwpe, doubled(dwpe_expected), kGradientTolerance);
}

// ---- layer norm ---------------------------------------------------------------------------

TEST_CASE("layernorm forward and backward", "[kernels]") {
    auto ops = make_cpu_ops(2);
    const int N = 10;
    const int C = GENERATE(8, 80);  // 80: more than one of the backward's column blocks
    // An offset mean, so the variance is not computed from a near-zero-mean row only.
    const auto inp = random_floats(N * C, 21, 2.0f, 4.0f);
    const auto weight = random_floats(C, 22, 0.5f, 1.5f);
    const auto bias = random_floats(C, 23);

    std::vector<float> out(N * C), mean(N), rstd(N);
    ops->layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(),
                           bias.data(), N, C);
    std::vector<double> expected;
    layernorm_reference(expected, to_double(inp), to_double(weight), to_double(bias), N, C);
    check_close("out", out, expected, kForwardTolerance);

    const auto dout = random_floats(N * C, 24);
    std::vector<float> dinp(N * C, 0.0f), dweight(C, 0.0f), dbias(C, 0.0f);
    ops->layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                            weight.data(), mean.data(), rstd.data(), N, C);

    auto inp_d = to_double(inp), weight_d = to_double(weight), bias_d = to_double(bias);
    const auto dout_d = to_double(dout);
    auto objective = [&] {
        std::vector<double> y;
        layernorm_reference(y, inp_d, weight_d, bias_d, N, C);
        return dot(y, dout_d);
    };
    const auto dinp_expected = numeric_gradient(objective, inp_d);
    const auto dweight_expected = numeric_gradient(objective, weight_d);
    const auto dbias_expected = numeric_gradient(objective, bias_d);
    check_close("dinp", dinp, dinp_expected, kGradientTolerance);
    check_close("dweight", dweight, dweight_expected, kGradientTolerance);
    check_close("dbias", dbias, dbias_expected, kGradientTolerance);

    ops->layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                            weight.data(), mean.data(), rstd.data(), N, C);
    check_close("dinp", dinp, doubled(dinp_expected), kGradientTolerance);
    check_close("dweight", dweight, doubled(dweight_expected), kGradientTolerance);
    check_close("dbias", dbias, doubled(dbias_expected), kGradientTolerance);
}

// ---- linear -------------------------------------------------------------------------------

TEST_CASE("matmul forward and backward", "[kernels]") {
    auto ops = make_cpu_ops(2);
    // Shapes chosen so that, on two threads, the GEMMs of the forward and of both gradients
    // are each split by rows and by columns somewhere, and dbias spans two column blocks.
    const auto [N, C, OC] = GENERATE(table<int, int, int>({
        {10, 8, 12},
        {40, 24, 36},
        {40, 24, 72},
        {20, 40, 36},
    }));
    CAPTURE(N, C, OC);
    const auto inp = random_floats(N * C, 31);
    const auto weight = random_floats(OC * C, 32);
    const auto bias = random_floats(OC, 33);
    auto inp_d = to_double(inp), weight_d = to_double(weight), bias_d = to_double(bias);

    std::vector<float> out(N * OC);
    std::vector<double> expected;
    ops->matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
    matmul_reference(expected, inp_d, weight_d, &bias_d, N, C, OC);
    check_close("out", out, expected, kForwardTolerance);
    ops->matmul_forward(out.data(), inp.data(), weight.data(), nullptr, N, C, OC);
    matmul_reference<double>(expected, inp_d, weight_d, nullptr, N, C, OC);
    check_close("out", out, expected, kForwardTolerance);

    const auto dout = random_floats(N * OC, 34);
    const auto dout_d = to_double(dout);
    auto objective = [&] {
        std::vector<double> y;
        matmul_reference(y, inp_d, weight_d, &bias_d, N, C, OC);
        return dot(y, dout_d);
    };
    const auto dinp_expected = numeric_gradient(objective, inp_d);
    const auto dweight_expected = numeric_gradient(objective, weight_d);
    const auto dbias_expected = numeric_gradient(objective, bias_d);

    std::vector<float> dinp(N * C, 0.0f), dweight(OC * C, 0.0f), dbias(OC, 0.0f);
    SECTION("all gradients") {
        ops->matmul_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                             weight.data(), N, C, OC);
        check_close("dinp", dinp, dinp_expected, kGradientTolerance);
        check_close("dweight", dweight, dweight_expected, kGradientTolerance);
        check_close("dbias", dbias, dbias_expected, kGradientTolerance);

        ops->matmul_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                             weight.data(), N, C, OC);
        check_close("dinp", dinp, doubled(dinp_expected), kGradientTolerance);
        check_close("dweight", dweight, doubled(dweight_expected), kGradientTolerance);
        check_close("dbias", dbias, doubled(dbias_expected), kGradientTolerance);
    }
    SECTION("no dinp, no dbias") {
        ops->matmul_backward(nullptr, dweight.data(), nullptr, dout.data(), inp.data(),
                             weight.data(), N, C, OC);
        check_close("dweight", dweight, dweight_expected, kGradientTolerance);
    }
}

// ---- attention ----------------------------------------------------------------------------

void check_attention(float drop_prob) {
    auto ops = make_cpu_ops(2);
    const int B = 2, Tn = 5, C = 8, NH = 2;
    const uint64_t seed = 1234;
    const auto qkv = random_floats(B * Tn * 3 * C, 41, -2.0f, 2.0f);
    auto qkv_d = to_double(qkv);

    std::vector<float> out(B * Tn * C), att(B * NH * Tn * Tn);
    ops->attention_forward(out.data(), att.data(), qkv.data(), B, Tn, C, NH, drop_prob, seed);
    std::vector<double> out_expected, att_expected;
    attention_reference(out_expected, att_expected, qkv_d, B, Tn, C, NH, drop_prob, seed);
    check_close("out", out, out_expected, kForwardTolerance);
    check_close("att", att, att_expected, kForwardTolerance);
    for (int bh = 0; bh < B * NH; bh++)
        for (int t = 0; t < Tn; t++)
            for (int j = t + 1; j < Tn; j++) CHECK(att[(bh * Tn + t) * Tn + j] == 0.0f);

    const auto dout = random_floats(B * Tn * C, 42);
    const auto dout_d = to_double(dout);
    std::vector<float> dqkv(B * Tn * 3 * C, 0.0f), scratch(B * NH * Tn * Tn);
    ops->attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, Tn,
                            C, NH, drop_prob, seed);
    auto objective = [&] {
        std::vector<double> y, a;
        attention_reference(y, a, qkv_d, B, Tn, C, NH, drop_prob, seed);
        return dot(y, dout_d);
    };
    const auto dqkv_expected = numeric_gradient(objective, qkv_d);
    check_close("dqkv", dqkv, dqkv_expected, kGradientTolerance);

    // "+=": a second call on top of the first doubles the gradient.
    ops->attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, Tn,
                            C, NH, drop_prob, seed);
    check_close("dqkv", dqkv, doubled(dqkv_expected), kGradientTolerance);
}

TEST_CASE("attention forward and backward", "[kernels]") {
    check_attention(0.0f);
}

TEST_CASE("attention forward and backward with dropout", "[kernels]") {
    check_attention(0.3f);
}

// ---- pointwise ----------------------------------------------------------------------------

TEST_CASE("gelu forward and backward", "[kernels]") {
    auto ops = make_cpu_ops(2);
    const std::size_t count = 200;
    // Wide enough to reach both saturated tails of tanh.
    const auto inp = random_floats(count, 51, -6.0f, 6.0f);
    std::vector<float> out(count);
    ops->gelu_forward(out.data(), inp.data(), count);
    std::vector<double> expected(count);
    for (std::size_t i = 0; i < count; i++) expected[i] = gelu_reference<double>(inp[i]);
    check_close("out", out, expected, kForwardTolerance);

    const auto dout = random_floats(count, 52);
    std::vector<float> dinp(count, 0.0f);
    ops->gelu_backward(dinp.data(), inp.data(), dout.data(), count);
    auto inp_d = to_double(inp);
    const auto dout_d = to_double(dout);
    auto objective = [&] {
        double sum = 0.0;
        for (std::size_t i = 0; i < count; i++) sum += dout_d[i] * gelu_reference(inp_d[i]);
        return sum;
    };
    const auto dinp_expected = numeric_gradient(objective, inp_d);
    check_close("dinp", dinp, dinp_expected, kGradientTolerance);

    ops->gelu_backward(dinp.data(), inp.data(), dout.data(), count);
    check_close("dinp", dinp, doubled(dinp_expected), kGradientTolerance);
}

TEST_CASE("residual forward", "[kernels]") {
    auto ops = make_cpu_ops(2);
    const std::size_t count = 100;
    const auto a = random_floats(count, 61), b = random_floats(count, 62);
    std::vector<float> out(count);
    ops->residual_forward(out.data(), a.data(), b.data(), count);
    for (std::size_t i = 0; i < count; i++) CHECK(out[i] == a[i] + b[i]);
}

TEST_CASE("dropout forward and backward", "[kernels]") {
    auto ops = make_cpu_ops(2);
    const uint64_t seed = 77;

    SECTION("against the reference and finite differences") {
        const std::size_t count = 100;
        const float p = 0.4f;
        const auto inp = random_floats(count, 71);
        std::vector<float> out(count);
        ops->dropout_forward(out.data(), inp.data(), count, p, seed);
        std::vector<double> expected;
        dropout_reference(expected, to_double(inp), p, seed);
        check_close("out", out, expected, kForwardTolerance);

        const auto dout = random_floats(count, 72);
        std::vector<float> dinp(count, 0.0f);
        ops->dropout_backward(dinp.data(), dout.data(), count, p, seed);
        auto inp_d = to_double(inp);
        const auto dout_d = to_double(dout);
        auto objective = [&] {
            std::vector<double> y;
            dropout_reference(y, inp_d, p, seed);
            return dot(y, dout_d);
        };
        const auto dinp_expected = numeric_gradient(objective, inp_d);
        check_close("dinp", dinp, dinp_expected, kGradientTolerance);

        ops->dropout_backward(dinp.data(), dout.data(), count, p, seed);
        check_close("dinp", dinp, doubled(dinp_expected), kGradientTolerance);
    }
    SECTION("keeps 1-p of the elements, scaled by 1/(1-p)") {
        const std::size_t count = 200000;
        const float p = 0.25f;
        const std::vector<float> ones(count, 1.0f);
        std::vector<float> out(count);
        ops->dropout_forward(out.data(), ones.data(), count, p, seed);
        std::size_t kept = 0, wrong = 0;
        for (float x : out) {
            kept += x != 0.0f;
            wrong += x != 0.0f && x != 1.0f / (1.0f - p);
        }
        CHECK(wrong == 0);
        // The binomial's standard deviation here is ~0.001.
        CHECK(static_cast<double>(kept) / count == Approx(1.0 - p).margin(0.005));
    }
    SECTION("p = 0 is the identity") {
        const std::size_t count = 1000;
        const auto inp = random_floats(count, 73);
        std::vector<float> out(count);
        ops->dropout_forward(out.data(), inp.data(), count, 0.0f, seed);
        CHECK(bitwise_equal(out, inp));
        std::vector<float> dinp(count, 0.0f);
        ops->dropout_backward(dinp.data(), inp.data(), count, 0.0f, seed);
        CHECK(bitwise_equal(dinp, inp));
    }
}

// ---- loss ---------------------------------------------------------------------------------

TEST_CASE("cross entropy forward and backward over padded logits", "[kernels]") {
    auto ops = make_cpu_ops(2);
    const int N = 10, V = 13, Vp = 16;
    const float dloss = 1.0f / N;
    auto logits = random_floats(N * Vp, 81, -4.0f, 4.0f);
    const auto targets = random_ints(N, 82, V);

    std::vector<float> losses(N), lse(N);
    ops->cross_entropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), N, V, Vp);
    auto logits_d = to_double(logits);
    std::vector<double> expected;
    cross_entropy_reference(expected, logits_d, targets, N, V, Vp);
    check_close("losses", losses, expected, kForwardTolerance);

    std::vector<float> dlogits(N * Vp, 1.0f);  // overwritten, not accumulated into
    ops->cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), dloss, N,
                                V, Vp);
    auto objective = [&] {
        std::vector<double> l;
        cross_entropy_reference(l, logits_d, targets, N, V, Vp);
        double sum = 0.0;
        for (double x : l) sum += dloss * x;
        return sum;
    };
    check_close("dlogits", dlogits, numeric_gradient(objective, logits_d), kGradientTolerance);
    for (int n = 0; n < N; n++)
        for (int c = V; c < Vp; c++) CHECK(dlogits[n * Vp + c] == 0.0f);

    SECTION("padded columns do not take part") {
        auto padded = logits;
        for (int n = 0; n < N; n++)
            for (int c = V; c < Vp; c++) padded[n * Vp + c] = (c % 2 ? 1e30f : -1e30f);
        std::vector<float> losses2(N), lse2(N), dlogits2(N * Vp);
        ops->cross_entropy_forward(losses2.data(), lse2.data(), padded.data(), targets.data(), N, V,
                                   Vp);
        ops->cross_entropy_backward(dlogits2.data(), padded.data(), lse2.data(), targets.data(),
                                    dloss, N, V, Vp);
        CHECK(bitwise_equal(losses2, losses));
        CHECK(bitwise_equal(lse2, lse));
        CHECK(bitwise_equal(dlogits2, dlogits));
    }
    SECTION("dlogits may alias logits") {
        auto in_place = logits;
        ops->cross_entropy_backward(in_place.data(), in_place.data(), lse.data(), targets.data(),
                                    dloss, N, V, Vp);
        CHECK(bitwise_equal(in_place, dlogits));
    }
}

// ---- optimizer ----------------------------------------------------------------------------

TEST_CASE("sum of squares and scale", "[kernels]") {
    auto ops = make_cpu_ops(2);
    const std::size_t count = 300001;  // several of the kernel's chunks, and a ragged end
    const auto x = random_floats(count, 91);
    double expected = 0.0;
    for (float value : x) expected += static_cast<double>(value) * value;
    CHECK(ops->sum_of_squares(x.data(), count) == Approx(expected).epsilon(1e-12));
    CHECK(ops->sum_of_squares(x.data(), 0) == 0.0);

    auto scaled = x;
    ops->scale(scaled.data(), count, 0.37f);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; i++) wrong += scaled[i] != x[i] * 0.37f;
    CHECK(wrong == 0);
}

TEST_CASE("adamw update matches torch's formula over three steps", "[kernels]") {
    auto ops = make_cpu_ops(2);
    const std::size_t count = 100;
    const float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
    auto params = random_floats(count, 101);
    std::vector<float> m(count, 0.0f), v(count, 0.0f);
    auto params_d = to_double(params);
    std::vector<double> m_d(count, 0.0), v_d(count, 0.0);

    for (int step = 1; step <= 3; step++) {
        const auto grads = random_floats(count, 102 + step);
        ops->adamw_update(params.data(), grads.data(), m.data(), v.data(), count, lr, beta1, beta2,
                          eps, weight_decay, step);
        const double bias_correction1 = 1.0 - std::pow(double(beta1), step);
        const double bias_correction2 = 1.0 - std::pow(double(beta2), step);
        for (std::size_t i = 0; i < count; i++) {
            const double g = grads[i];
            params_d[i] *= 1.0 - double(lr) * weight_decay;
            m_d[i] = beta1 * m_d[i] + (1.0 - beta1) * g;
            v_d[i] = beta2 * v_d[i] + (1.0 - beta2) * g * g;
            const double denom = std::sqrt(v_d[i]) / std::sqrt(bias_correction2) + eps;
            params_d[i] -= double(lr) / bias_correction1 * m_d[i] / denom;
        }
    }
    check_close("params", params, params_d, 1e-6);
    check_close("m", m, m_d, 1e-6);
    check_close("v", v, v_d, 1e-5);
}

// ---- determinism --------------------------------------------------------------------------

TEST_CASE("ops repeat bit for bit", "[kernels]") {
    auto ops = make_cpu_ops(2);
    // Big enough that every loop is split over threads and the GEMMs take several tiles.
    const int B = 2, Tn = 64, C = 64, NH = 4, N = B * Tn, OC = 192, V = 1000, Vp = 1024;
    const auto inp = random_floats(N * C, 111);
    const auto weight = random_floats(OC * C, 112);
    const auto bias = random_floats(OC, 113);
    const auto qkv = random_floats(N * 3 * C, 114, -2.0f, 2.0f);
    const auto dout = random_floats(N * C, 115);
    const auto dout_oc = random_floats(N * OC, 116);
    const auto logits = random_floats(N * Vp, 117, -5.0f, 5.0f);
    const auto targets = random_ints(N, 118, V);
    const auto tokens = random_ints(N, 119, 50);

    auto run_all = [&] {
        std::vector<std::vector<float>> results;
        std::vector<float> out(N * OC), dinp(N * C, 0.0f), dweight(OC * C, 0.0f), dbias(OC, 0.0f);
        ops->matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
        ops->matmul_backward(dinp.data(), dweight.data(), dbias.data(), dout_oc.data(), inp.data(),
                             weight.data(), N, C, OC);
        results.insert(results.end(), {out, dinp, dweight, dbias});

        std::vector<float> att_out(N * C), att(B * NH * Tn * Tn), scratch(att.size());
        std::vector<float> dqkv(N * 3 * C, 0.0f);
        ops->attention_forward(att_out.data(), att.data(), qkv.data(), B, Tn, C, NH, 0.1f, 5);
        ops->attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B,
                                Tn, C, NH, 0.1f, 5);
        results.insert(results.end(), {att_out, att, dqkv});

        std::vector<float> ln_out(N * C), mean(N), rstd(N), ln_dinp(N * C, 0.0f), dw(C, 0.0f),
            db(C, 0.0f);
        ops->layernorm_forward(ln_out.data(), mean.data(), rstd.data(), inp.data(), weight.data(),
                               bias.data(), N, C);
        ops->layernorm_backward(ln_dinp.data(), dw.data(), db.data(), dout.data(), inp.data(),
                                weight.data(), mean.data(), rstd.data(), N, C);
        results.insert(results.end(), {ln_out, ln_dinp, dw, db});

        std::vector<float> losses(N), lse(N), dlogits(N * Vp);
        ops->cross_entropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), N, V,
                                   Vp);
        ops->cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), 0.5f,
                                    N, V, Vp);
        results.insert(results.end(), {losses, lse, dlogits});

        std::vector<float> dwte(50 * C, 0.0f), dwpe(Tn * C, 0.0f);
        ops->embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, Tn, C);
        results.insert(results.end(), {dwte, dwpe});
        const double norm = ops->sum_of_squares(dout_oc.data(), dout_oc.size());
        results.push_back({static_cast<float>(norm), static_cast<float>(norm - float(norm))});
        return results;
    };
    const auto first = run_all();
    const auto second = run_all();
    REQUIRE(first.size() == second.size());
    for (std::size_t i = 0; i < first.size(); i++) {
        INFO("result " << i);
        CHECK(bitwise_equal(first[i], second[i]));
    }
}

}  // namespace
