// Generation's cached decoder (model/decoder.h) against the full-context rerun
// (Gpt::logits_at, training's attention kernel): the same logits at every step, within 1e-5
// relative (max|a-b| / max|b| over the vocabulary, fp32), and the same greedy tokens, for GPT-2
// and for llama with kv_heads < heads, from prompts of 1 and 5 tokens, through the sliding of
// the window when the cache is full.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/model_shape.h"
#include "kernels/ops.h"
#include "model/decoder.h"
#include "model/gpt.h"
#include "model/model_spec.h"
#include "model/part_kinds.h"
#include "solo_grid.h"
#include "train/generator.h"

using namespace trident;

namespace {

// The model of a config's `model:` section.
model::GptShape shape_of(const std::string& model_yaml) {
    return config::gpt_shape(config::parse(
        "model: " + model_yaml +
            "\ntraining: {micro_batch: 1, global_batch: 1, steps: 1}\ndata: {train: unused.bin}\n",
        "decoder.yaml"));
}

double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
        scale = std::max(scale, std::abs(static_cast<double>(b[i])));
    }
    return diff / scale;
}

int32_t argmax(const std::vector<float>& v) {
    return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Steps the decoder greedily from `prompt`, comparing each step's logits with the rerun of the
// whole model over the decoder's window; then train::generate must give the same tokens.
void check_against_rerun(const std::string& model_yaml, int prompt_length) {
    const model::GptShape shape = shape_of(model_yaml);
    auto ops = kernels::make_cpu_ops(2);
    parallel::Grid& solo = test::solo_grid();
    const model::ModelGroups groups{solo.tensor(), solo.context(), solo.kv_replicas()};
    model::GptOptions options;
    options.shape = shape;
    model::Gpt rerun(*ops, options, groups);
    model::init_random(rerun.weights(), 11, 0.5f);
    model::Decoder decoder(*ops, shape, groups, rerun.weights().params_to_host());

    const int T = shape.max_seq;
    std::vector<int32_t> context;
    for (int i = 0; i < prompt_length; ++i) context.push_back((7 * i + 3) % shape.vocab);
    std::vector<int32_t> window(context), expected;
    std::vector<float> cached = decoder.prefill(window);
    const int steps = 3 * T;  // the window slides more than once
    for (int i = 0; i < steps; ++i) {
        std::vector<int32_t> inputs(window);
        inputs.resize(static_cast<std::size_t>(T), 0);
        const std::vector<float> full =
            rerun.logits_at(inputs.data(), static_cast<int>(window.size()) - 1);
        INFO("step " << i << ", window of " << window.size());
        REQUIRE(relative_error(cached, full) <= 1e-5);
        const int32_t next = argmax(full);
        REQUIRE(argmax(cached) == next);
        context.push_back(next);
        expected.push_back(next);
        if (decoder.length() < T) {
            window.push_back(next);
            cached = decoder.step(next);
        } else {
            window.assign(context.end() - static_cast<std::ptrdiff_t>(train::kept_on_slide(T)),
                          context.end());
            cached = decoder.prefill(window);
        }
    }
    train::SamplingOptions greedy;
    greedy.tokens = steps;
    greedy.temperature = 0;
    const std::vector<int32_t> prompt(context.begin(), context.begin() + prompt_length);
    REQUIRE(train::generate(decoder, prompt, greedy) == expected);
}

const char* const kGpt2 = "{vocab_size: 64, seq_len: 8, layers: 2, hidden: 32, heads: 4}";
const char* const kLlama =
    "{arch: llama, vocab_size: 64, seq_len: 8, layers: 2, hidden: 32, heads: 4, kv_heads: 2, "
    "ffn_hidden: 48, rope_theta: 500000}";

}  // namespace

TEST_CASE("cached decoding equals the full-context rerun: gpt2", "[generate]") {
    check_against_rerun(kGpt2, 1);
    check_against_rerun(kGpt2, 5);
}

TEST_CASE("cached decoding equals the full-context rerun: llama with grouped heads", "[generate]") {
    check_against_rerun(kLlama, 1);
    check_against_rerun(kLlama, 5);
}

TEST_CASE("cached decoding equals the full-context rerun: llama with qk_norm", "[generate]") {
    const char* const qwen3 =
        "{arch: llama, vocab_size: 64, seq_len: 8, layers: 2, hidden: 32, heads: 4, kv_heads: 2, "
        "ffn_hidden: 48, rope_theta: 500000, qk_norm: true}";
    REQUIRE(model::resolve_spec(shape_of(qwen3)).layers.front().attention->qk_norm);
    check_against_rerun(qwen3, 1);
    check_against_rerun(qwen3, 5);
}

TEST_CASE("a llama cache holds kv_heads heads", "[generate]") {
    const model::GptShape shape = shape_of(kLlama);
    auto ops = kernels::make_cpu_ops(1);
    const model::KvCache cache(*ops, shape);
    // layers · (k, v) · seq_len · kv_heads · head size: half of a cache of the 4 heads.
    REQUIRE(cache.count() == 2u * 2 * 8 * 2 * 8);
}
