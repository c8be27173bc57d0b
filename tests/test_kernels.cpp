// Tests of the CPU backend's op set (kernels/ops.h).
//
// Every forward op is checked against a plain-loop reference written here, templated on the
// scalar type and run in double. Every backward op is checked against central finite
// differences of that double reference, on the objective L = sum(dout * forward(x)) for a
// random dout, so the gradients are tested against the forward's definition rather than
// against a second hand-derived formula. The tensor-parallel arguments are checked by
// splitting: a vocabulary, a set of heads, a run of elements or the logit columns cut into
// slices, each computed as one rank would, then combined as the callers do and compared with
// the op on the whole. The rest covers the "+=" convention, dropout's statistics, AdamW
// against a hand-computed double loop, bitwise determinism, and the CPU backend's own exp
// approximation.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ops.h"

namespace {

using trident::kernels::dropout_keep;
using trident::kernels::DType;
using trident::kernels::make_cpu_ops;
using trident::kernels::Ptr;
using trident::kernels::to_bf16;

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

// wte holds the vocabulary rows [vocab_begin, vocab_begin + vocab_local); wpe may be null.
template <typename T>
void embedding_reference(std::vector<T>& out, const std::vector<int32_t>& tokens,
                         const std::vector<T>& wte, const std::vector<T>* wpe, int B, int Tn,
                         int channels, int vocab_begin, int vocab_local) {
    out.assign(static_cast<std::size_t>(B) * Tn * channels, T(0));
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tn; t++) {
            const int row = tokens[b * Tn + t] - vocab_begin;
            for (int c = 0; c < channels; c++) {
                T sum = row >= 0 && row < vocab_local ? wte[row * channels + c] : T(0);
                if (wpe != nullptr) sum += (*wpe)[t * channels + c];
                out[(b * Tn + t) * channels + c] = sum;
            }
        }
}

template <typename T>
void layernorm_reference(std::vector<T>& out, const std::vector<T>& inp,
                         const std::vector<T>& weight, const std::vector<T>& bias, int N,
                         int channels) {
    out.assign(static_cast<std::size_t>(N) * channels, T(0));
    for (int n = 0; n < N; n++) {
        T mean = 0;
        for (int c = 0; c < channels; c++) mean += inp[n * channels + c];
        mean /= channels;
        T var = 0;
        for (int c = 0; c < channels; c++)
            var += (inp[n * channels + c] - mean) * (inp[n * channels + c] - mean);
        var /= channels;
        const T rstd = T(1) / std::sqrt(var + T(1e-5));
        for (int c = 0; c < channels; c++)
            out[n * channels + c] = (inp[n * channels + c] - mean) * rstd * weight[c] + bias[c];
    }
}

template <typename T>
void matmul_reference(std::vector<T>& out, const std::vector<T>& inp, const std::vector<T>& weight,
                      const std::vector<T>* bias, int N, int channels, int OC) {
    out.assign(static_cast<std::size_t>(N) * OC, T(0));
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            T sum = bias != nullptr ? (*bias)[o] : T(0);
            for (int c = 0; c < channels; c++)
                sum += inp[n * channels + c] * weight[o * channels + c];
            out[n * OC + o] = sum;
        }
}

// att (B,NH,Tn,Tn) and out (B,Tn,channels) for heads head_begin.. of heads_total; attention dropout
// by the flat index into the whole model's (B,heads_total,Tn,Tn).
template <typename T>
void attention_reference(std::vector<T>& out, std::vector<T>& att, const std::vector<T>& qkv, int B,
                         int Tn, int channels, int NH, float drop_prob, uint64_t seed,
                         int head_begin, int heads_total) {
    const int hs = channels / NH;
    const T scale = T(1) / std::sqrt(T(hs));
    const T keep_scale = T(1) / (T(1) - T(drop_prob));
    out.assign(static_cast<std::size_t>(B) * Tn * channels, T(0));
    att.assign(static_cast<std::size_t>(B) * NH * Tn * Tn, T(0));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < Tn; t++) {
                const T* q = &qkv[(b * Tn + t) * 3 * channels + h * hs];
                T* row = &att[((b * NH + h) * Tn + t) * Tn];
                T max = -std::numeric_limits<T>::infinity();
                for (int j = 0; j <= t; j++) {
                    const T* k = &qkv[(b * Tn + j) * 3 * channels + channels + h * hs];
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
                    const std::size_t head = b * heads_total + head_begin + h;  // global
                    const std::size_t index = (head * Tn + t) * Tn + j;
                    const T p = dropout_keep(seed, index, drop_prob) ? row[j] * keep_scale : T(0);
                    const T* v = &qkv[(b * Tn + j) * 3 * channels + 2 * channels + h * hs];
                    for (int i = 0; i < hs; i++)
                        out[(b * Tn + t) * channels + h * hs + i] += p * v[i];
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
                       uint64_t seed, uint64_t index_begin) {
    out.resize(inp.size());
    for (std::size_t i = 0; i < inp.size(); i++)
        out[i] =
            dropout_keep(seed, index_begin + i, drop_prob) ? inp[i] / (T(1) - T(drop_prob)) : T(0);
}

// The whole softmax cross-entropy over the real columns of logits (N,Vp); lse (N) beside.
template <typename T>
void cross_entropy_reference(std::vector<T>& losses, std::vector<T>& lse,
                             const std::vector<T>& logits, const std::vector<int32_t>& targets,
                             int N, int V, int Vp) {
    losses.assign(N, T(0));
    lse.assign(N, T(0));
    for (int n = 0; n < N; n++) {
        T max = logits[n * Vp];
        for (int c = 0; c < V; c++) max = std::max(max, logits[n * Vp + c]);
        T sum = 0;
        for (int c = 0; c < V; c++) sum += std::exp(logits[n * Vp + c] - max);
        lse[n] = max + std::log(sum);
        losses[n] = lse[n] - logits[n * Vp + targets[n]];
    }
}

// The vocab-parallel pipeline of kernels/ops.h on the whole logits (N,Vp), cut into `slices`
// slices of Vp/slices columns: each slice's partials, then their combination (max, rescale,
// sum) and the losses. Written out in T so that finite differences can go through it.
template <typename T>
void split_cross_entropy_reference(std::vector<T>& losses, const std::vector<T>& logits,
                                   const std::vector<int32_t>& targets, int N, int V, int Vp,
                                   int slices) {
    const int local = Vp / slices;
    losses.assign(N, T(0));
    for (int n = 0; n < N; n++) {
        std::vector<T> row_max(slices, -std::numeric_limits<T>::infinity());
        std::vector<T> row_sumexp(slices, T(0));
        T target_logit = 0;
        for (int s = 0; s < slices; s++) {
            const int begin = s * local, end = std::min(V, begin + local);
            for (int c = begin; c < end; c++) row_max[s] = std::max(row_max[s], logits[n * Vp + c]);
            for (int c = begin; c < end; c++)
                row_sumexp[s] += std::exp(logits[n * Vp + c] - row_max[s]);
            if (targets[n] >= begin && targets[n] < end)
                target_logit += logits[n * Vp + targets[n]];
        }
        const T global_max = *std::max_element(row_max.begin(), row_max.end());
        T sumexp = 0;
        for (int s = 0; s < slices; s++)
            if (row_sumexp[s] > T(0)) sumexp += row_sumexp[s] * std::exp(row_max[s] - global_max);
        losses[n] = global_max + std::log(sumexp) - target_logit;
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
    float* buffer = ops->allocate(count, DType::f32).f32();
    REQUIRE(buffer != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(buffer) % 64 == 0);
    CHECK(std::all_of(buffer, buffer + count, [](float x) { return x == 0.0f; }));

    const auto host = random_floats(count, 1);
    ops->copy_from_host(buffer, host.data(), count);
    float* other = ops->allocate(count, DType::f32).f32();
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
    const int channels = GENERATE(8, 80);  // 80: more than one of the backward's channel blocks
    // Repeated tokens, within and across sequences, make the backward a true reduction.
    const std::vector<int32_t> tokens = {3, 7, 3, 0, 15, 7, 7, 2, 3, 9};
    const auto wte = random_floats(Vp * channels, 11);
    const auto wpe = random_floats(Tn * channels, 12);

    std::vector<float> out(B * Tn * channels);
    ops->embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, Tn, channels, 0,
                           Vp, nullptr, Tn);
    std::vector<double> expected;
    const auto wpe_expected = to_double(wpe);
    embedding_reference(expected, tokens, to_double(wte), &wpe_expected, B, Tn, channels, 0, Vp);
    check_close("out", out, expected, kForwardTolerance);

    const auto dout = random_floats(B * Tn * channels, 13);
    std::vector<float> dwte(Vp * channels, 0.0f), dwpe(Tn * channels, 0.0f);
    ops->embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, Tn, channels,
                            0, Vp, nullptr, Tn);

    auto wte_d = to_double(wte), wpe_d = to_double(wpe);
    const auto dout_d = to_double(dout);
    auto objective = [&] {
        std::vector<double> y;
        embedding_reference(y, tokens, wte_d, &wpe_d, B, Tn, channels, 0, Vp);
        return dot(y, dout_d);
    };
    const auto dwte_expected = numeric_gradient(objective, wte_d);
    const auto dwpe_expected = numeric_gradient(objective, wpe_d);
    check_close("dwte", dwte, dwte_expected, kGradientTolerance);
    check_close("dwpe", dwpe, dwpe_expected, kGradientTolerance);

    // "+=": a second call on top of the first doubles the gradients.
    ops->embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, Tn, channels,
                            0, Vp, nullptr, Tn);
    check_close("dwte", dwte, doubled(dwte_expected), kGradientTolerance);
    check_close("dwpe", dwpe, doubled(dwpe_expected), kGradientTolerance);
}

// Vocab-parallel: each rank holds a slice of wte's rows and only the first adds wpe; the sum
// of the ranks' outputs is the whole embedding, and each rank's dwte is its rows of the whole
// dwte. Both bitwise: every element is the same one or two terms, in the same order.
TEST_CASE("embedding over vocabulary slices adds up to the whole", "[kernels]") {
    auto ops = make_cpu_ops(2);
    const int B = 2, Tn = 5, Vp = 16;
    const int channels = GENERATE(8, 80);
    const std::vector<int32_t> tokens = {3, 7, 3, 0, 15, 7, 7, 2, 3, 9};
    const auto wte = random_floats(Vp * channels, 14);
    const auto wpe = random_floats(Tn * channels, 15);
    const auto dout = random_floats(B * Tn * channels, 16);

    std::vector<float> whole(B * Tn * channels), dwte_whole(Vp * channels, 0.0f),
        dwpe_whole(Tn * channels, 0.0f);
    ops->embedding_forward(whole.data(), tokens.data(), wte.data(), wpe.data(), B, Tn, channels, 0,
                           Vp, nullptr, Tn);
    ops->embedding_backward(dwte_whole.data(), dwpe_whole.data(), dout.data(), tokens.data(), B, Tn,
                            channels, 0, Vp, nullptr, Tn);

    // Uneven slices; the last, [12, 16), is used by one token only, and [10, 12) by none.
    const std::vector<int> bounds = {0, 5, 10, 12, Vp};
    std::vector<float> sum(B * Tn * channels, 0.0f), dwpe(Tn * channels, 0.0f);
    for (std::size_t s = 0; s + 1 < bounds.size(); s++) {
        const int begin = bounds[s], local = bounds[s + 1] - bounds[s];
        CAPTURE(begin, local);
        const std::vector<float> wte_slice(wte.begin() + begin * channels,
                                           wte.begin() + (begin + local) * channels);
        const float* rank_wpe = s == 0 ? wpe.data() : nullptr;
        float* rank_dwpe = s == 0 ? dwpe.data() : nullptr;

        std::vector<float> part(B * Tn * channels);
        ops->embedding_forward(part.data(), tokens.data(), wte_slice.data(), rank_wpe, B, Tn,
                               channels, begin, local, nullptr, Tn);
        std::vector<double> expected;
        const auto wpe_d = to_double(wpe);
        embedding_reference(expected, tokens, to_double(wte_slice), s == 0 ? &wpe_d : nullptr, B,
                            Tn, channels, begin, local);
        check_close("part", part, expected, kForwardTolerance);
        for (std::size_t i = 0; i < sum.size(); i++) sum[i] += part[i];

        std::vector<float> dwte_slice(local * channels, 0.0f);
        ops->embedding_backward(dwte_slice.data(), rank_dwpe, dout.data(), tokens.data(), B, Tn,
                                channels, begin, local, nullptr, Tn);
        const std::vector<float> rows(dwte_whole.begin() + begin * channels,
                                      dwte_whole.begin() + (begin + local) * channels);
        CHECK(bitwise_equal(dwte_slice, rows));
    }
    CHECK(bitwise_equal(sum, whole));
    CHECK(bitwise_equal(dwpe, dwpe_whole));
}

// ---- layer norm ---------------------------------------------------------------------------

TEST_CASE("layernorm forward and backward", "[kernels]") {
    auto ops = make_cpu_ops(2);
    const int N = 10;
    const int channels = GENERATE(8, 80);  // 80: more than one of the backward's column blocks
    // An offset mean, so the variance is not computed from a near-zero-mean row only.
    const auto inp = random_floats(N * channels, 21, 2.0f, 4.0f);
    const auto weight = random_floats(channels, 22, 0.5f, 1.5f);
    const auto bias = random_floats(channels, 23);

    std::vector<float> out(N * channels), mean(N), rstd(N);
    ops->layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(),
                           bias.data(), N, channels);
    std::vector<double> expected;
    layernorm_reference(expected, to_double(inp), to_double(weight), to_double(bias), N, channels);
    check_close("out", out, expected, kForwardTolerance);

    const auto dout = random_floats(N * channels, 24);
    std::vector<float> dinp(N * channels, 0.0f), dweight(channels, 0.0f), dbias(channels, 0.0f);
    ops->layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                            weight.data(), mean.data(), rstd.data(), N, channels);

    auto inp_d = to_double(inp), weight_d = to_double(weight), bias_d = to_double(bias);
    const auto dout_d = to_double(dout);
    auto objective = [&] {
        std::vector<double> y;
        layernorm_reference(y, inp_d, weight_d, bias_d, N, channels);
        return dot(y, dout_d);
    };
    const auto dinp_expected = numeric_gradient(objective, inp_d);
    const auto dweight_expected = numeric_gradient(objective, weight_d);
    const auto dbias_expected = numeric_gradient(objective, bias_d);
    check_close("dinp", dinp, dinp_expected, kGradientTolerance);
    check_close("dweight", dweight, dweight_expected, kGradientTolerance);
    check_close("dbias", dbias, dbias_expected, kGradientTolerance);

    ops->layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                            weight.data(), mean.data(), rstd.data(), N, channels);
    check_close("dinp", dinp, doubled(dinp_expected), kGradientTolerance);
    check_close("dweight", dweight, doubled(dweight_expected), kGradientTolerance);
    check_close("dbias", dbias, doubled(dbias_expected), kGradientTolerance);
}

// ---- linear -------------------------------------------------------------------------------

TEST_CASE("matmul forward and backward", "[kernels]") {
    auto ops = make_cpu_ops(2);
    // Shapes chosen so that, on two threads, the GEMMs of the forward and of both gradients
    // are each split by rows and by columns somewhere, and dbias spans two column blocks.
    const auto [N, channels, OC] = GENERATE(table<int, int, int>({
        {10, 8, 12},
        {40, 24, 36},
        {40, 24, 72},
        {20, 40, 36},
    }));
    CAPTURE(N, channels, OC);
    const auto inp = random_floats(N * channels, 31);
    const auto weight = random_floats(OC * channels, 32);
    const auto bias = random_floats(OC, 33);
    auto inp_d = to_double(inp), weight_d = to_double(weight), bias_d = to_double(bias);

    std::vector<float> out(N * OC);
    std::vector<double> expected;
    ops->matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), N, channels, OC);
    matmul_reference(expected, inp_d, weight_d, &bias_d, N, channels, OC);
    check_close("out", out, expected, kForwardTolerance);
    ops->matmul_forward(out.data(), inp.data(), weight.data(), nullptr, N, channels, OC);
    matmul_reference<double>(expected, inp_d, weight_d, nullptr, N, channels, OC);
    check_close("out", out, expected, kForwardTolerance);

    const auto dout = random_floats(N * OC, 34);
    const auto dout_d = to_double(dout);
    auto objective = [&] {
        std::vector<double> y;
        matmul_reference(y, inp_d, weight_d, &bias_d, N, channels, OC);
        return dot(y, dout_d);
    };
    const auto dinp_expected = numeric_gradient(objective, inp_d);
    const auto dweight_expected = numeric_gradient(objective, weight_d);
    const auto dbias_expected = numeric_gradient(objective, bias_d);

    std::vector<float> dinp(N * channels, 0.0f), dweight(OC * channels, 0.0f), dbias(OC, 0.0f);
    SECTION("all gradients") {
        ops->matmul_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                             weight.data(), N, channels, OC);
        check_close("dinp", dinp, dinp_expected, kGradientTolerance);
        check_close("dweight", dweight, dweight_expected, kGradientTolerance);
        check_close("dbias", dbias, dbias_expected, kGradientTolerance);

        ops->matmul_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                             weight.data(), N, channels, OC);
        check_close("dinp", dinp, doubled(dinp_expected), kGradientTolerance);
        check_close("dweight", dweight, doubled(dweight_expected), kGradientTolerance);
        check_close("dbias", dbias, doubled(dbias_expected), kGradientTolerance);
    }
    SECTION("no dinp, no dbias") {
        ops->matmul_backward(nullptr, dweight.data(), nullptr, dout.data(), inp.data(),
                             weight.data(), N, channels, OC);
        check_close("dweight", dweight, dweight_expected, kGradientTolerance);
    }
}

TEST_CASE("add_bias adds the bias to every row", "[kernels]") {
    auto ops = make_cpu_ops(2);
    const int N = 37, OC = 70;  // odd sizes: ragged thread split and vector tails
    const auto before = random_floats(N * OC, 35);
    const auto bias = random_floats(OC, 36);
    auto out = before;
    ops->add_bias(out.data(), bias.data(), N, OC);
    std::size_t wrong = 0;
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) wrong += out[n * OC + o] != before[n * OC + o] + bias[o];
    CHECK(wrong == 0);
}

// ---- attention ----------------------------------------------------------------------------

void check_attention(float drop_prob) {
    auto ops = make_cpu_ops(2);
    const int B = 2, Tn = 5, channels = 8, NH = 2;
    const uint64_t seed = 1234;
    const auto qkv = random_floats(B * Tn * 3 * channels, 41, -2.0f, 2.0f);
    auto qkv_d = to_double(qkv);

    std::vector<float> out(B * Tn * channels), att(B * NH * Tn * Tn);
    ops->attention_forward(out.data(), att.data(), qkv.data(), B, Tn, channels, NH, drop_prob, seed,
                           0, NH);
    std::vector<double> out_expected, att_expected;
    attention_reference(out_expected, att_expected, qkv_d, B, Tn, channels, NH, drop_prob, seed, 0,
                        NH);
    check_close("out", out, out_expected, kForwardTolerance);
    check_close("att", att, att_expected, kForwardTolerance);
    for (int bh = 0; bh < B * NH; bh++)
        for (int t = 0; t < Tn; t++)
            for (int j = t + 1; j < Tn; j++) CHECK(att[(bh * Tn + t) * Tn + j] == 0.0f);

    const auto dout = random_floats(B * Tn * channels, 42);
    const auto dout_d = to_double(dout);
    std::vector<float> dqkv(B * Tn * 3 * channels, 0.0f);
    ops->attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), att.data(), B, Tn,
                            channels, NH, drop_prob, seed, 0, NH);
    auto objective = [&] {
        std::vector<double> y, a;
        attention_reference(y, a, qkv_d, B, Tn, channels, NH, drop_prob, seed, 0, NH);
        return dot(y, dout_d);
    };
    const auto dqkv_expected = numeric_gradient(objective, qkv_d);
    check_close("dqkv", dqkv, dqkv_expected, kGradientTolerance);

    // "+=": a second call on top of the first doubles the gradient.
    ops->attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), att.data(), B, Tn,
                            channels, NH, drop_prob, seed, 0, NH);
    check_close("dqkv", dqkv, doubled(dqkv_expected), kGradientTolerance);
}

TEST_CASE("attention forward and backward", "[kernels]") {
    check_attention(0.0f);
}

TEST_CASE("attention forward and backward with dropout", "[kernels]") {
    check_attention(0.3f);
}

// Selective recompute rebuilds what attention keeps (on the CPU the probabilities) for
// backward: it must be the forward's, bit for bit, with or without dropout (which acts after
// them) and for any head offset.
TEST_CASE("attention_rebuild gives attention_forward's saved probabilities exactly",
          "[kernels][recompute]") {
    auto ops = make_cpu_ops(2);
    const int B = 2, Tn = 7, channels = 12, NH = 3;
    const auto qkv = random_floats(B * Tn * 3 * channels, 43, -2.0f, 2.0f);
    for (float drop_prob : {0.0f, 0.3f}) {
        std::vector<float> out(B * Tn * channels), att(B * NH * Tn * Tn);
        ops->attention_forward(out.data(), att.data(), qkv.data(), B, Tn, channels, NH, drop_prob,
                               99, 3, 2 * NH);
        std::vector<float> rebuilt(att.size(), -1.0f);
        ops->attention_rebuild(rebuilt.data(), qkv.data(), B, Tn, channels, NH, drop_prob);
        CHECK(rebuilt == att);
    }
}

// Tensor parallelism splits the heads: each half computes its heads from its share of q, k
// and v, and must draw the dropout mask the whole model draws for those heads.
TEST_CASE("attention over half the heads matches those heads of the whole", "[kernels]") {
    auto ops = make_cpu_ops(2);
    const int B = 2, Tn = 6, NH = 4, hs = 4, channels = NH * hs;
    const int half_heads = NH / 2, half_C = half_heads * hs;
    const float drop_prob = 0.3f;
    const uint64_t seed = 4321;
    const auto qkv = random_floats(B * Tn * 3 * channels, 43, -2.0f, 2.0f);
    const auto dout = random_floats(B * Tn * channels, 44);

    std::vector<float> out(B * Tn * channels), att(B * NH * Tn * Tn);
    std::vector<float> dqkv(B * Tn * 3 * channels, 0.0f);
    ops->attention_forward(out.data(), att.data(), qkv.data(), B, Tn, channels, NH, drop_prob, seed,
                           0, NH);
    ops->attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), att.data(), B, Tn,
                            channels, NH, drop_prob, seed, 0, NH);

    // Columns [first, first + width) of every row of x (rows, row_width), as a rank holds them.
    auto columns = [](const std::vector<float>& x, int row_width, int first, int width) {
        const std::size_t rows = x.size() / row_width;
        std::vector<float> part(rows * width);
        for (std::size_t r = 0; r < rows; r++)
            std::copy_n(x.begin() + r * row_width + first, width, part.begin() + r * width);
        return part;
    };
    // A rank's share of a (B,Tn,3·channels) tensor: its heads' columns of q, of k and of v.
    auto qkv_share = [&](const std::vector<float>& x, int head_begin) {
        std::vector<float> share(B * Tn * 3 * half_C);
        for (int bt = 0; bt < B * Tn; bt++)
            for (int part = 0; part < 3; part++)
                std::copy_n(x.begin() + (bt * 3 + part) * channels + head_begin * hs, half_C,
                            share.begin() + (bt * 3 + part) * half_C);
        return share;
    };

    for (int head_begin : {0, half_heads}) {
        CAPTURE(head_begin);
        const auto qkv_half = qkv_share(qkv, head_begin);
        const auto dout_half = columns(dout, channels, head_begin * hs, half_C);
        std::vector<float> out_half(B * Tn * half_C), att_half(B * half_heads * Tn * Tn);
        std::vector<float> dqkv_half(qkv_half.size(), 0.0f);
        ops->attention_forward(out_half.data(), att_half.data(), qkv_half.data(), B, Tn, half_C,
                               half_heads, drop_prob, seed, head_begin, NH);
        ops->attention_backward(dqkv_half.data(), dout_half.data(), qkv_half.data(),
                                out_half.data(), att_half.data(), B, Tn, half_C, half_heads,
                                drop_prob, seed, head_begin, NH);

        // att (B,NH,Tn,Tn) viewed as B rows of NH*Tn*Tn: the half's heads are a column range.
        const auto att_expected =
            columns(att, NH * Tn * Tn, head_begin * Tn * Tn, half_heads * Tn * Tn);
        check_close("att", att_half, to_double(att_expected), 1e-6);
        // A mask drawn at the wrong index would change out and dqkv by O(1), not by rounding.
        check_close("out", out_half, to_double(columns(out, channels, head_begin * hs, half_C)),
                    1e-6);
        check_close("dqkv", dqkv_half, to_double(qkv_share(dqkv, head_begin)), 1e-6);

        std::vector<double> out_reference, att_reference;
        attention_reference(out_reference, att_reference, to_double(qkv_half), B, Tn, half_C,
                            half_heads, drop_prob, seed, head_begin, NH);
        check_close("out against the reference", out_half, out_reference, kForwardTolerance);
    }
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

TEST_CASE("relu and the product", "[kernels]") {
    auto ops = make_cpu_ops(2);
    const std::size_t count = 100;
    const auto a = random_floats(count, 63), b = random_floats(count, 64);
    std::vector<float> out(count);
    ops->relu_forward(out.data(), a.data(), count);
    for (std::size_t i = 0; i < count; i++) CHECK(out[i] == (a[i] > 0 ? a[i] : 0.0f));
    CHECK(std::count(out.begin(), out.end(), 0.0f) > 10);  // some negative inputs
    ops->multiply(out.data(), a.data(), b.data(), count, 2.0f);
    for (std::size_t i = 0; i < count; i++) CHECK(out[i] == a[i] * b[i] * 2.0f);
    std::vector<float> in_place = a;
    ops->multiply(in_place.data(), in_place.data(), in_place.data(), count, 1.0f);
    for (std::size_t i = 0; i < count; i++) CHECK(in_place[i] == a[i] * a[i]);
    // Rows scaled: row i of (10, 10) times factor i, bitwise the product with the factor
    // repeated over the row.
    const std::size_t rows = 10, cols = count / rows;
    const auto factors = random_floats(rows, 65);
    std::vector<float> wide(count);
    for (std::size_t i = 0; i < count; i++) wide[i] = factors[i / cols];
    std::vector<float> by_product(count);
    ops->multiply(by_product.data(), a.data(), wide.data(), count, 1.0f);
    ops->scale_rows(out.data(), a.data(), factors.data(), rows, cols);
    CHECK(out == by_product);
    CHECK(out[cols] == a[cols] * factors[1]);
    in_place = a;
    ops->scale_rows(in_place.data(), in_place.data(), factors.data(), rows, cols);
    CHECK(in_place == by_product);
}

TEST_CASE("dropout forward and backward", "[kernels]") {
    auto ops = make_cpu_ops(2);
    const uint64_t seed = 77;

    SECTION("against the reference and finite differences") {
        const std::size_t count = 100;
        const float p = 0.4f;
        const auto inp = random_floats(count, 71);
        std::vector<float> out(count);
        ops->dropout_forward(out.data(), inp.data(), count, p, seed, 0);
        std::vector<double> expected;
        dropout_reference(expected, to_double(inp), p, seed, 0);
        check_close("out", out, expected, kForwardTolerance);

        const auto dout = random_floats(count, 72);
        std::vector<float> dinp(count, 0.0f);
        ops->dropout_backward(dinp.data(), dout.data(), count, p, seed, 0);
        auto inp_d = to_double(inp);
        const auto dout_d = to_double(dout);
        auto objective = [&] {
            std::vector<double> y;
            dropout_reference(y, inp_d, p, seed, 0);
            return dot(y, dout_d);
        };
        const auto dinp_expected = numeric_gradient(objective, inp_d);
        check_close("dinp", dinp, dinp_expected, kGradientTolerance);

        ops->dropout_backward(dinp.data(), dout.data(), count, p, seed, 0);
        check_close("dinp", dinp, doubled(dinp_expected), kGradientTolerance);
    }
    SECTION("two ranks' halves, each from its index_begin, make the whole") {
        // An odd split, so the halves' vector loops start and end at different lanes.
        const std::size_t count = 1001, split = 403;
        const uint64_t base = 5000;  // the whole's own first global index
        const float p = 0.4f;
        const auto inp = random_floats(count, 74);
        const auto dout = random_floats(count, 75);
        std::vector<float> out(count), dinp(count, 0.0f);
        ops->dropout_forward(out.data(), inp.data(), count, p, seed, base);
        ops->dropout_backward(dinp.data(), dout.data(), count, p, seed, base);
        std::vector<double> expected;
        dropout_reference(expected, to_double(inp), p, seed, base);
        check_close("out", out, expected, kForwardTolerance);

        std::vector<float> out_halves(count), dinp_halves(count, 0.0f);
        for (const auto& [begin, end] :
             {std::pair{std::size_t{0}, split}, std::pair{split, count}}) {
            ops->dropout_forward(out_halves.data() + begin, inp.data() + begin, end - begin, p,
                                 seed, base + begin);
            ops->dropout_backward(dinp_halves.data() + begin, dout.data() + begin, end - begin, p,
                                  seed, base + begin);
        }
        CHECK(bitwise_equal(out_halves, out));
        CHECK(bitwise_equal(dinp_halves, dinp));
    }
    SECTION("keeps 1-p of the elements, scaled by 1/(1-p)") {
        const std::size_t count = 200000;
        const float p = 0.25f;
        const std::vector<float> ones(count, 1.0f);
        std::vector<float> out(count);
        ops->dropout_forward(out.data(), ones.data(), count, p, seed, 0);
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
        ops->dropout_forward(out.data(), inp.data(), count, 0.0f, seed, 0);
        CHECK(bitwise_equal(out, inp));
        std::vector<float> dinp(count, 0.0f);
        ops->dropout_backward(dinp.data(), inp.data(), count, 0.0f, seed, 0);
        CHECK(bitwise_equal(dinp, inp));
    }
}

// ---- loss ---------------------------------------------------------------------------------

// The vocab-parallel cross-entropy as the callers run it, on one process: the logits (N,Vp)
// cut into `slices` ranks' slices of Vp/slices columns; each slice's partials; the
// all-reduce max, the rescale of each slice and the all-reduce sums, done here in slice order;
// the losses; then each slice's backward with the combined lse.
struct SplitCrossEntropy {
    std::vector<float> losses, lse;  // (N)
    // Per slice: its partials (N) before any combination, and its dlogits (N, Vp/slices).
    std::vector<std::vector<float>> row_max, row_sumexp, target_logit, dlogits;
};

SplitCrossEntropy split_cross_entropy(trident::kernels::Ops& ops, const std::vector<float>& logits,
                                      const std::vector<int32_t>& targets, float dloss, int N,
                                      int V, int Vp, int slices) {
    const int local = Vp / slices;
    SplitCrossEntropy result;
    std::vector<std::vector<float>> slice_logits(slices);
    for (int s = 0; s < slices; s++) {
        auto& x = slice_logits[s];
        x.resize(static_cast<std::size_t>(N) * local);
        for (int n = 0; n < N; n++)
            std::copy_n(logits.begin() + n * Vp + s * local, local, x.begin() + n * local);
        result.row_max.emplace_back(N);
        result.row_sumexp.emplace_back(N);
        result.target_logit.emplace_back(N);
        ops.cross_entropy_partials(result.row_max[s].data(), result.row_sumexp[s].data(),
                                   result.target_logit[s].data(), x.data(), targets.data(), N,
                                   s * local, V, local);
    }
    std::vector<float> global_max(N, -std::numeric_limits<float>::infinity());
    for (int s = 0; s < slices; s++)
        for (int n = 0; n < N; n++) global_max[n] = std::max(global_max[n], result.row_max[s][n]);
    std::vector<float> sumexp(N, 0.0f), target_logit(N, 0.0f);
    for (int s = 0; s < slices; s++) {
        auto rescaled = result.row_sumexp[s];
        ops.cross_entropy_rescale(rescaled.data(), result.row_max[s].data(), global_max.data(), N);
        for (int n = 0; n < N; n++) {
            sumexp[n] += rescaled[n];
            target_logit[n] += result.target_logit[s][n];
        }
    }
    result.losses.resize(N);
    result.lse.resize(N);
    ops.cross_entropy_losses(result.losses.data(), result.lse.data(), global_max.data(),
                             sumexp.data(), target_logit.data(), N);
    for (int s = 0; s < slices; s++) {
        result.dlogits.emplace_back(static_cast<std::size_t>(N) * local, 1.0f);  // overwritten
        ops.cross_entropy_backward(result.dlogits[s].data(), slice_logits[s].data(),
                                   result.lse.data(), targets.data(), dloss, N, s * local, V,
                                   local);
    }
    return result;
}

TEST_CASE("cross entropy forward and backward over padded logits", "[kernels]") {
    auto ops = make_cpu_ops(2);
    const int N = 10, V = 13, Vp = 16;
    const float dloss = 1.0f / N;
    auto logits = random_floats(N * Vp, 81, -4.0f, 4.0f);
    const auto targets = random_ints(N, 82, V);

    // One rank holding every column: the pipeline of kernels/ops.h with nothing to combine.
    const auto whole = split_cross_entropy(*ops, logits, targets, dloss, N, V, Vp, 1);
    auto logits_d = to_double(logits);
    std::vector<double> losses_expected, lse_expected;
    cross_entropy_reference(losses_expected, lse_expected, logits_d, targets, N, V, Vp);
    check_close("losses", whole.losses, losses_expected, kForwardTolerance);
    check_close("lse", whole.lse, lse_expected, kForwardTolerance);

    const auto& dlogits = whole.dlogits[0];
    auto objective = [&] {
        std::vector<double> l, lse;
        cross_entropy_reference(l, lse, logits_d, targets, N, V, Vp);
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
        const auto other = split_cross_entropy(*ops, padded, targets, dloss, N, V, Vp, 1);
        CHECK(bitwise_equal(other.losses, whole.losses));
        CHECK(bitwise_equal(other.lse, whole.lse));
        CHECK(bitwise_equal(other.dlogits[0], dlogits));
    }
    SECTION("dlogits may alias logits") {
        auto in_place = logits;
        ops->cross_entropy_backward(in_place.data(), in_place.data(), whole.lse.data(),
                                    targets.data(), dloss, N, 0, V, Vp);
        CHECK(bitwise_equal(in_place, dlogits));
    }
}

// The columns cut over 2 and 4 ranks (and 1), with slices that hold real tokens only, real
// tokens then padding, and (V = 13, Vp = 32) padding only. The combined losses must be the
// whole softmax cross-entropy, and each slice's dlogits its columns of the whole backward.
TEST_CASE("vocab-parallel cross entropy over column slices matches the whole", "[kernels]") {
    auto ops = make_cpu_ops(2);
    // The wide case gives slices of more than one of the partials' 1024-column sum blocks.
    const auto [N, V, Vp] = GENERATE(table<int, int, int>({{10, 13, 32}, {3, 2100, 2304}}));
    const int slices = GENERATE(1, 2, 4);
    const int local = Vp / slices;
    CAPTURE(N, V, Vp, slices);
    const float dloss = 1.0f / N;
    const auto logits = random_floats(N * Vp, 83, -4.0f, 4.0f);
    auto targets = random_ints(N, 84, V);
    targets[0] = 0;      // the first real column
    targets[1] = V - 1;  // the last, beside the padding

    const auto split = split_cross_entropy(*ops, logits, targets, dloss, N, V, Vp, slices);
    std::vector<double> losses_expected, lse_expected;
    cross_entropy_reference(losses_expected, lse_expected, to_double(logits), targets, N, V, Vp);
    check_close("losses", split.losses, losses_expected, kForwardTolerance);
    check_close("lse", split.lse, lse_expected, kForwardTolerance);

    // Each slice's partials, by their definition.
    for (int s = 0; s < slices; s++) {
        CAPTURE(s);
        const int begin = s * local, end = std::min(V, begin + local);
        for (int n = 0; n < N; n++) {
            float max = -std::numeric_limits<float>::infinity();
            double sumexp = 0.0;
            for (int c = begin; c < end; c++) max = std::max(max, logits[n * Vp + c]);
            for (int c = begin; c < end; c++) sumexp += std::exp(double(logits[n * Vp + c]) - max);
            const bool has_target = targets[n] >= begin && targets[n] < end;
            CHECK(split.row_max[s][n] == max);  // -inf for a slice of padding only
            CHECK(split.row_sumexp[s][n] == Approx(sumexp).epsilon(1e-5).margin(0.0));
            CHECK(split.target_logit[s][n] == (has_target ? logits[n * Vp + targets[n]] : 0.0f));
        }
    }
    // A slice of padding only: rescaled, its sum must stay 0 (not NaN) whatever the max.
    if (V <= (slices - 1) * local) {
        const auto& row_max = split.row_max[slices - 1];
        auto sumexp = split.row_sumexp[slices - 1];
        const std::vector<float> finite_max(N, 3.0f);
        const std::vector<float> infinite_max(N, -std::numeric_limits<float>::infinity());
        for (const auto* global_max : {&finite_max, &infinite_max}) {
            ops->cross_entropy_rescale(sumexp.data(), row_max.data(), global_max->data(), N);
            CHECK(std::all_of(sumexp.begin(), sumexp.end(), [](float x) { return x == 0.0f; }));
        }
    }

    // The backward: each slice is its columns of the whole, computed with the same lse.
    std::vector<float> whole(N * Vp);
    ops->cross_entropy_backward(whole.data(), logits.data(), split.lse.data(), targets.data(),
                                dloss, N, 0, V, Vp);
    std::vector<float> joined(N * Vp);  // the slices' dlogits side by side, as (N,Vp)
    for (int s = 0; s < slices; s++)
        for (int n = 0; n < N; n++)
            std::copy_n(split.dlogits[s].begin() + n * local, local,
                        joined.begin() + n * Vp + s * local);
    check_close("dlogits against the whole", joined, to_double(whole), 1e-6);
    for (int n = 0; n < N; n++)
        for (int c = V; c < Vp; c++) CHECK(joined[n * Vp + c] == 0.0f);

    // Finite differences through the split pipeline, written out in double.
    if (Vp <= 32) {
        auto logits_d = to_double(logits);
        auto objective = [&] {
            std::vector<double> l;
            split_cross_entropy_reference(l, logits_d, targets, N, V, Vp, slices);
            double sum = 0.0;
            for (double x : l) sum += dloss * x;
            return sum;
        };
        check_close("dlogits", joined, numeric_gradient(objective, logits_d), kGradientTolerance);
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

TEST_CASE("the gradient norm and the loss add into one total on the device", "[kernels]") {
    auto ops = make_cpu_ops(2);
    // The norm: each buffer's sum of squares is added to what the total holds, so buffers
    // summed one after another give, bit for bit, their sums added in that order.
    const auto x = random_floats(200003, 93);
    const std::size_t split = 70001;
    double total = 0.5;  // the CPU backend's device memory is the host's
    ops->add_sum_of_squares(&total, x.data(), split);
    ops->add_sum_of_squares(&total, x.data() + split, x.size() - split);
    const double first = ops->sum_of_squares(x.data(), split),
                 second = ops->sum_of_squares(x.data() + split, x.size() - split);
    CHECK(total == (0.5 + first) + second);
    double expected = 0.5;
    for (float value : x) expected += static_cast<double>(value) * value;
    CHECK(total == Approx(expected).epsilon(1e-12));

    // The loss: each microbatch's mean, summed in double in row order and rounded to fp32,
    // is added to the total, as the step's loss sum was formed on the host.
    const auto losses_a = random_floats(1000, 94), losses_b = random_floats(777, 95);
    double loss_sum = 0.0;
    ops->add_mean(&loss_sum, losses_a.data(), static_cast<int>(losses_a.size()));
    ops->add_mean(&loss_sum, losses_b.data(), static_cast<int>(losses_b.size()));
    const auto mean_of = [](const std::vector<float>& l) {
        double sum = 0.0;
        for (float value : l) sum += value;
        return static_cast<float>(sum / static_cast<double>(l.size()));
    };
    CHECK(loss_sum == static_cast<double>(mean_of(losses_a)) + mean_of(losses_b));
}

TEST_CASE("adamw update matches torch's formula over three steps", "[kernels]") {
    auto ops = make_cpu_ops(2);
    const std::size_t count = 100;
    const float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
    const float grad_scale = 0.25f;  // unscaling and clipping, folded in
    auto params = random_floats(count, 101);
    std::vector<float> m(count, 0.0f), v(count, 0.0f);
    std::vector<uint16_t> params_bf16(count);  // the working copy, written in the same pass
    auto params_d = to_double(params);
    std::vector<double> m_d(count, 0.0), v_d(count, 0.0);

    for (int step = 1; step <= 3; step++) {
        const auto grads = random_floats(count, 102 + step);
        ops->adamw_update(params.data(), grads.data(), m.data(), v.data(), count, lr, beta1, beta2,
                          eps, weight_decay, step, grad_scale,
                          Ptr(params_bf16.data(), DType::bf16));
        for (std::size_t i = 0; i < count; i++) REQUIRE(params_bf16[i] == to_bf16(params[i]));
        const double bias_correction1 = 1.0 - std::pow(double(beta1), step);
        const double bias_correction2 = 1.0 - std::pow(double(beta2), step);
        for (std::size_t i = 0; i < count; i++) {
            const double g = double(grads[i]) * grad_scale;
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
    const int B = 2, Tn = 64, channels = 64, NH = 4, N = B * Tn, OC = 192, V = 1000, Vp = 1024;
    const auto inp = random_floats(N * channels, 111);
    const auto weight = random_floats(OC * channels, 112);
    const auto bias = random_floats(OC, 113);
    const auto qkv = random_floats(N * 3 * channels, 114, -2.0f, 2.0f);
    const auto dout = random_floats(N * channels, 115);
    const auto dout_oc = random_floats(N * OC, 116);
    const auto logits = random_floats(N * Vp, 117, -5.0f, 5.0f);
    const auto targets = random_ints(N, 118, V);
    const auto tokens = random_ints(N, 119, 50);

    auto run_all = [&] {
        std::vector<std::vector<float>> results;
        std::vector<float> out(N * OC), dinp(N * channels, 0.0f), dweight(OC * channels, 0.0f),
            dbias(OC, 0.0f);
        ops->matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), N, channels, OC);
        ops->matmul_backward(dinp.data(), dweight.data(), dbias.data(), dout_oc.data(), inp.data(),
                             weight.data(), N, channels, OC);
        results.insert(results.end(), {out, dinp, dweight, dbias});

        std::vector<float> att_out(N * channels), att(B * NH * Tn * Tn);
        std::vector<float> dqkv(N * 3 * channels, 0.0f);
        // Heads 2..5 of 8: a rank's share under tensor parallelism.
        ops->attention_forward(att_out.data(), att.data(), qkv.data(), B, Tn, channels, NH, 0.1f, 5,
                               2, 8);
        ops->attention_backward(dqkv.data(), dout.data(), qkv.data(), att_out.data(), att.data(), B,
                                Tn, channels, NH, 0.1f, 5, 2, 8);
        results.insert(results.end(), {att_out, att, dqkv});

        std::vector<float> ln_out(N * channels), mean(N), rstd(N), ln_dinp(N * channels, 0.0f),
            dw(channels, 0.0f), db(channels, 0.0f);
        ops->layernorm_forward(ln_out.data(), mean.data(), rstd.data(), inp.data(), weight.data(),
                               bias.data(), N, channels);
        ops->layernorm_backward(ln_dinp.data(), dw.data(), db.data(), dout.data(), inp.data(),
                                weight.data(), mean.data(), rstd.data(), N, channels);
        results.insert(results.end(), {ln_out, ln_dinp, dw, db});

        // The slice [512, 1024) of the vocabulary: real columns then padding.
        const int begin = Vp / 2, local = Vp / 2;
        std::vector<float> row_max(N), row_sumexp(N), target_logit(N), losses(N), lse(N);
        std::vector<float> dlogits(N * local);
        ops->cross_entropy_partials(row_max.data(), row_sumexp.data(), target_logit.data(),
                                    logits.data(), targets.data(), N, begin, V, local);
        results.insert(results.end(), {row_max, row_sumexp, target_logit});
        std::vector<float> global_max(N);
        for (int n = 0; n < N; n++) global_max[n] = row_max[n] + 0.25f;  // another rank's
        ops->cross_entropy_rescale(row_sumexp.data(), row_max.data(), global_max.data(), N);
        ops->cross_entropy_losses(losses.data(), lse.data(), global_max.data(), row_sumexp.data(),
                                  target_logit.data(), N);
        ops->cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), 0.5f,
                                    N, begin, V, local);
        results.insert(results.end(), {row_sumexp, losses, lse, dlogits});

        std::vector<float> biased = out;
        ops->add_bias(biased.data(), bias.data(), N, OC);
        results.push_back(biased);

        std::vector<float> embedded(N * channels), dwte(20 * channels, 0.0f),
            dwpe(Tn * channels, 0.0f);
        ops->embedding_forward(embedded.data(), tokens.data(), weight.data(), inp.data(), B, Tn,
                               channels, 20, 20, nullptr,
                               Tn);  // rows 20..39 of the vocabulary, weight as wte
        ops->embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, Tn,
                                channels, 20, 20, nullptr, Tn);
        results.insert(results.end(), {embedded, dwte, dwpe});
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

// ---- 16-bit buffers -------------------------------------------------------------------------

// A 16-bit buffer on the host, and its values widened.
struct Half {
    DType dtype;
    std::vector<uint16_t> bits;
    Half(DType t, const std::vector<float>& values) : dtype(t), bits(values.size()) {
        trident::kernels::narrow(Ptr(bits.data(), t), values.data(), values.size());
    }
    Ptr ptr() { return Ptr(bits.data(), dtype); }
    std::vector<float> floats() const {
        std::vector<float> out(bits.size());
        trident::kernels::widen(out.data(), trident::kernels::ConstPtr(bits.data(), dtype),
                                out.size());
        return out;
    }
};

// What a 16-bit op must give: the fp32 op on the widened inputs, rounded once.
std::vector<float> rounded(DType t, std::vector<float> v) {
    for (float& x : v) x = trident::kernels::round_to(t, x);
    return v;
}

TEST_CASE("16-bit ops compute in fp32 on widened inputs and round their outputs once",
          "[kernels]") {
    auto ops = make_cpu_ops(2);
    for (DType t : {DType::bf16, DType::f16}) {
        INFO("type " << trident::kernels::name_of(t));
        const int B = 2, T = 8, channels = 16, NH = 2, N = B * T, OC = 24;
        Half inp(t, random_floats(N * channels, 1)), weight(t, random_floats(OC * channels, 2)),
            bias(t, random_floats(OC, 3)), dout(t, random_floats(N * OC, 4));
        Half dinp(t, random_floats(N * channels, 5)), dweight(t, random_floats(OC * channels, 6)),
            dbias(t, random_floats(OC, 7));
        // The fp32 reference on the same (widened) values.
        auto r_out = std::vector<float>(N * OC);
        auto r_dinp = dinp.floats(), r_dweight = dweight.floats(), r_dbias = dbias.floats();
        ops->matmul_forward(r_out.data(), inp.floats().data(), weight.floats().data(),
                            bias.floats().data(), N, channels, OC);
        ops->matmul_backward(r_dinp.data(), r_dweight.data(), r_dbias.data(), dout.floats().data(),
                             inp.floats().data(), weight.floats().data(), N, channels, OC);
        Half out(t, std::vector<float>(N * OC));
        ops->matmul_forward(out.ptr(), inp.ptr(), weight.ptr(), bias.ptr(), N, channels, OC);
        ops->matmul_backward(dinp.ptr(), dweight.ptr(), dbias.ptr(), dout.ptr(), inp.ptr(),
                             weight.ptr(), N, channels, OC);
        CHECK(bitwise_equal(out.floats(), rounded(t, r_out)));
        CHECK(bitwise_equal(dinp.floats(), rounded(t, r_dinp)));  // += : rounded after adding
        CHECK(bitwise_equal(dweight.floats(), rounded(t, r_dweight)));
        CHECK(bitwise_equal(dbias.floats(), rounded(t, r_dbias)));

        // LayerNorm: 16-bit output, fp32 statistics.
        std::vector<float> mean(N), rstd(N), r_mean(N), r_rstd(N), r_ln(N * channels);
        Half ln(t, std::vector<float>(N * channels));
        Half gain(t, random_floats(channels, 8, 0.5f, 1.5f)), shift(t, random_floats(channels, 9));
        ops->layernorm_forward(ln.ptr(), mean.data(), rstd.data(), inp.ptr(), gain.ptr(),
                               shift.ptr(), N, channels);
        ops->layernorm_forward(r_ln.data(), r_mean.data(), r_rstd.data(), inp.floats().data(),
                               gain.floats().data(), shift.floats().data(), N, channels);
        CHECK(bitwise_equal(ln.floats(), rounded(t, r_ln)));
        CHECK(bitwise_equal(mean, r_mean));
        CHECK(bitwise_equal(rstd, r_rstd));

        // Attention: two outputs, dropout on.
        Half qkv(t, random_floats(N * 3 * channels, 10)),
            att(t, std::vector<float>(B * NH * T * T)), atty(t, std::vector<float>(N * channels));
        std::vector<float> r_att(B * NH * T * T), r_atty(N * channels);
        ops->attention_forward(atty.ptr(), att.ptr(), qkv.ptr(), B, T, channels, NH, 0.1f, 5, 0,
                               NH);
        ops->attention_forward(r_atty.data(), r_att.data(), qkv.floats().data(), B, T, channels, NH,
                               0.1f, 5, 0, NH);
        CHECK(bitwise_equal(att.floats(), rounded(t, r_att)));
        CHECK(bitwise_equal(atty.floats(), rounded(t, r_atty)));

        // In place: dropout over its own input, dlogits over the logits.
        Half x(t, random_floats(N * channels, 11));
        const auto r_x0 = x.floats();
        std::vector<float> r_x(N * channels);
        ops->dropout_forward(x.ptr(), x.ptr(), N * channels, 0.3f, 9, 0);
        ops->dropout_forward(r_x.data(), r_x0.data(), N * channels, 0.3f, 9, 0);
        CHECK(bitwise_equal(x.floats(), rounded(t, r_x)));
        const int V = 20, Vp = 32;
        Half logits(t, random_floats(N * Vp, 12, -3.0f, 3.0f));
        std::vector<int32_t> targets(N);
        for (int i = 0; i < N; ++i) targets[i] = (i * 7) % V;
        std::vector<float> lse(N, 1.5f), r_dlogits(N * Vp);
        ops->cross_entropy_backward(r_dlogits.data(), logits.floats().data(), lse.data(),
                                    targets.data(), 0.25f, N, 0, V, Vp);
        ops->cross_entropy_backward(logits.ptr(), logits.ptr(), lse.data(), targets.data(), 0.25f,
                                    N, 0, V, Vp);
        CHECK(bitwise_equal(logits.floats(), rounded(t, r_dlogits)));

        // Norms read 16-bit gradients exactly; an inf anywhere makes the sum inf.
        const auto g = dout.floats();
        CHECK(ops->sum_of_squares(dout.ptr(), g.size()) == ops->sum_of_squares(g.data(), g.size()));
        Half overflowed(DType::f16, {1.0f, 70000.0f, 2.0f});
        CHECK(std::isinf(ops->sum_of_squares(overflowed.ptr(), 3)));
    }
}

}  // namespace
