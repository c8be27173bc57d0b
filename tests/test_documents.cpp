// Packed documents (data.documents: mask, model/documents.h): the documents found in a window's
// tokens; the CPU's attention within documents against each document's causal attention run
// alone, its rebuild, and one document being plain causal attention bit for bit; the config keys,
// their defaults (a llama's eos token from its config.json) and their refusals. The training
// semantics against PyTorch, on every layout family, are tests/python/test_documents.py's.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/config.h"
#include "kernels/ops.h"
#include "kernels/random.h"
#include "model/documents.h"
#include "model/hf_llama_config.h"
#include "temp_dir.h"

namespace {

using trident::config::ConfigError;
using trident::config::parse;
using trident::kernels::make_cpu_ops;

std::vector<float> hashed(std::size_t count, uint64_t seed) {
    std::vector<float> x(count);
    for (std::size_t i = 0; i < count; ++i)
        x[i] = static_cast<float>(trident::kernels::hash64(seed, i) % 2001) / 1000.0f - 1.0f;
    return x;
}

// Rows [begin, begin + n) of sequence b of a (B, T, width) tensor.
std::vector<float> rows_of(const std::vector<float>& x, int T, int width, int b, int begin, int n) {
    const auto at = x.begin() + (static_cast<std::ptrdiff_t>(b) * T + begin) * width;
    return {at, at + static_cast<std::ptrdiff_t>(n) * width};
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double worst = a.size() == b.size() ? 0.0 : INFINITY;
    for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
        worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
    return worst;
}

const std::string kMinimal = "data:\n  train: data/train.bin\n";

std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
    try {
        parse(yaml, "x.yaml", overrides);
    } catch (const ConfigError& e) {
        return e.what();
    }
    FAIL("expected a ConfigError for:\n" << yaml);
    return "";
}

}  // namespace

TEST_CASE("documents: starts, positions and uncounted rows from the eod tokens", "[documents]") {
    using namespace trident::model;
    const int32_t eod = 9;
    // Two windows of 6: [1 9 | 2 3 9 | 4] and [9 | 5 6 7 8 1].
    const std::vector<int32_t> tokens{1, 9, 2, 3, 9, 4, 9, 5, 6, 7, 8, 1};
    CHECK(document_starts(tokens.data(), 2, 6, eod) ==
          std::vector<int32_t>{0, 0, 2, 2, 2, 5, 0, 1, 1, 1, 1, 1});
    CHECK(eod_rows(tokens.data(), 2, 6, eod) == std::vector<int32_t>{1, 4, 6});
    CHECK(counted_positions(tokens.data(), 6, DocumentOptions{true, eod, true}) == 4);
    CHECK(counted_positions(tokens.data() + 6, 6, DocumentOptions{false, eod, true}) == 5);
    CHECK(counted_positions(tokens.data(), 6, DocumentOptions{true, eod, false}) == 6);
}

TEST_CASE("documents: attention within documents is each document's causal attention alone",
          "[documents][kernels]") {
    auto ops = make_cpu_ops(2);
    const int B = 2, T = 10, NH = 2, C = 8;
    // Window 0: documents [0, 3) and [3, 10); window 1: [0, 4), [4, 5), [5, 10).
    const std::vector<int32_t> starts{0, 0, 0, 3, 3, 3, 3, 3, 3, 3, 0, 0, 0, 0, 4, 5, 5, 5, 5, 5};
    const auto qkv = hashed(std::size_t(B) * T * 3 * C, 1);
    const auto dout = hashed(std::size_t(B) * T * C, 2);
    std::vector<float> out(dout.size()), att(std::size_t(B) * NH * T * T);
    std::vector<float> dqkv(qkv.size(), 0.0f);
    ops->document_attention_forward(out.data(), att.data(), qkv.data(), starts.data(), B, T, C, NH,
                                    0.0f, 0, 0, NH);
    ops->document_attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), att.data(),
                                     starts.data(), B, T, C, NH, 0.0f, 0, 0, NH);
    const std::vector<std::vector<int>> documents{{0, 3, 10}, {0, 4, 5, 10}};
    for (int b = 0; b < B; ++b) {
        for (std::size_t d = 0; d + 1 < documents[std::size_t(b)].size(); ++d) {
            const int begin = documents[std::size_t(b)][d],
                      n = documents[std::size_t(b)][d + 1] - begin;
            CAPTURE(b, begin, n);
            const auto q = rows_of(qkv, T, 3 * C, b, begin, n),
                       g = rows_of(dout, T, C, b, begin, n);
            std::vector<float> y(g.size()), a(std::size_t(NH) * n * n), dq(q.size(), 0.0f);
            ops->attention_forward(y.data(), a.data(), q.data(), 1, n, C, NH, 0.0f, 0, 0, NH);
            ops->attention_backward(dq.data(), g.data(), q.data(), y.data(), a.data(), 1, n, C, NH,
                                    0.0f, 0, 0, NH);
            CHECK(max_diff(rows_of(out, T, C, b, begin, n), y) <= 1e-6);
            CHECK(max_diff(rows_of(dqkv, T, 3 * C, b, begin, n), dq) <= 1e-6);
        }
    }
    // No probability outside [the row's document start, the row].
    for (int bh = 0; bh < B * NH; ++bh)
        for (int i = 0; i < T; ++i)
            for (int j = 0; j < T; ++j)
                if (j < starts[std::size_t(bh / NH * T + i)] || j > i)
                    CHECK(att[(std::size_t(bh) * T + i) * T + j] == 0.0f);
}

// Ring attention's block of keys 0..5 for query rows 6..11 of two windows: window 0's rows all
// start their documents at 6 (the block lies wholly in earlier documents), window 1's at 0.
// Window 0's keys and values are NaN: a block it skips is never read, so its output is zero,
// its log-sum-exp -inf and its gradients unchanged, while window 1's equal a run on finite keys
// bit for bit.
TEST_CASE("documents: ring attention skips a block wholly in earlier documents",
          "[documents][kernels]") {
    auto ops = make_cpu_ops(2);
    const int B = 2, rows = 6, C = 8, NH = 2;
    trident::kernels::AttentionBlock k;
    k.B = B, k.channels = C, k.NH = NH, k.q_rows = k.kv_rows = rows;
    k.q_begin = 0, k.q_count = rows, k.q_position = 6;
    k.k_begin = 0, k.k_count = rows, k.k_position = 0;
    k.seq_len = 12, k.head_begin = 0, k.heads_total = NH;
    const std::vector<int32_t> starts{6, 6, 6, 6, 6, 6, 0, 0, 0, 0, 0, 0};
    k.q_starts = starts.data();
    const auto qkv = hashed(std::size_t(B) * rows * 3 * C, 7);
    const auto dout = hashed(std::size_t(B) * rows * C, 8);
    auto finite = hashed(std::size_t(B) * rows * 2 * C, 9), poisoned = finite;
    std::fill(poisoned.begin(), poisoned.begin() + rows * 2 * C, NAN);
    const std::size_t RC = std::size_t(B) * rows * C, stats = std::size_t(B) * NH * rows;
    struct Result {
        std::vector<float> out, lse, dq, dkv;
    };
    const auto run = [&](const std::vector<float>& kv) {
        Result r{std::vector<float>(RC, 7.0f), std::vector<float>(stats, 7.0f),
                 std::vector<float>(RC, 0.5f), std::vector<float>(2 * RC, 0.5f)};
        ops->attention_block_forward(r.out.data(), r.lse.data(), qkv.data(), kv.data(), k);
        ops->attention_block_backward(r.dq.data(), r.dkv.data(), dout.data(), qkv.data(), kv.data(),
                                      r.out.data(), r.lse.data(), k);
        return r;
    };
    const Result a = run(poisoned), b = run(finite);
    const std::size_t half = RC / 2;
    for (std::size_t i = 0; i < half; ++i) {
        CHECK(a.out[i] == 0.0f);
        CHECK(a.dq[i] == 0.5f);
    }
    for (std::size_t i = 0; i < stats / 2; ++i) CHECK(std::isinf(a.lse[i]));
    for (std::size_t i = 0; i < 2 * half; ++i) CHECK(a.dkv[i] == 0.5f);
    CHECK(std::equal(a.out.begin() + half, a.out.end(), b.out.begin() + half));
    CHECK(std::equal(a.dq.begin() + half, a.dq.end(), b.dq.begin() + half));
    CHECK(std::equal(a.dkv.begin() + 2 * half, a.dkv.end(), b.dkv.begin() + 2 * half));
    CHECK(std::equal(a.lse.begin() + stats / 2, a.lse.end(), b.lse.begin() + stats / 2));
}

TEST_CASE("documents: the rebuild is the forward's, and one document is causal attention",
          "[documents][kernels][recompute]") {
    auto ops = make_cpu_ops(2);
    const int B = 2, T = 9, NH = 3, C = 12;
    const std::vector<int32_t> starts{0, 0, 2, 2, 2, 2, 6, 6, 6, 0, 1, 2, 3, 3, 3, 3, 3, 3};
    const std::vector<int32_t> whole(std::size_t(B) * T, 0);
    const auto qkv = hashed(std::size_t(B) * T * 3 * C, 3);
    const auto dout = hashed(std::size_t(B) * T * C, 4);
    for (float drop : {0.0f, 0.3f}) {
        CAPTURE(drop);
        std::vector<float> out(dout.size()), att(std::size_t(B) * NH * T * T);
        ops->document_attention_forward(out.data(), att.data(), qkv.data(), starts.data(), B, T, C,
                                        NH, drop, 99, 3, 2 * NH);
        std::vector<float> rebuilt(att.size(), -1.0f);
        ops->document_attention_rebuild(rebuilt.data(), qkv.data(), starts.data(), B, T, C, NH,
                                        drop);
        CHECK(rebuilt == att);

        std::vector<float> out_one(out.size()), att_one(att.size()), out_causal(out.size()),
            att_causal(att.size()), d_one(qkv.size(), 0.0f), d_causal(qkv.size(), 0.0f);
        ops->document_attention_forward(out_one.data(), att_one.data(), qkv.data(), whole.data(), B,
                                        T, C, NH, drop, 99, 3, 2 * NH);
        ops->attention_forward(out_causal.data(), att_causal.data(), qkv.data(), B, T, C, NH, drop,
                               99, 3, 2 * NH);
        ops->document_attention_backward(d_one.data(), dout.data(), qkv.data(), out_one.data(),
                                         att_one.data(), whole.data(), B, T, C, NH, drop, 99, 3,
                                         2 * NH);
        ops->attention_backward(d_causal.data(), dout.data(), qkv.data(), out_causal.data(),
                                att_causal.data(), B, T, C, NH, drop, 99, 3, 2 * NH);
        CHECK(out_one == out_causal);
        CHECK(att_one == att_causal);
        CHECK(d_one == d_causal);
    }
}

TEST_CASE("documents: the config keys, their defaults and their refusals", "[documents][config]") {
    using namespace trident::config;
    const Config c = parse(kMinimal, "x.yaml");
    CHECK(c.data.documents == DocumentMode::stream);
    CHECK(c.data.eod_token == 50256);
    CHECK_FALSE(c.data.mask_eod_loss);
    CHECK(c.training.loss_normalization == LossNormalization::microbatch);
    CHECK(std::string(to_string(DocumentMode::mask)) == "mask");
    CHECK(std::string(to_string(LossNormalization::tokens)) == "tokens");
    // GPT-2's eod outside a small vocabulary matters only when documents are read.
    CHECK(parse(kMinimal + "model: {vocab_size: 300}\n", "x.yaml").data.eod_token == 50256);
    const Config m = parse(kMinimal +
                               "  documents: mask\n  eod_token: 7\n  mask_eod_loss: true\n"
                               "training: {loss_normalization: tokens}\n",
                           "x.yaml");
    CHECK(m.data.documents == DocumentMode::mask);
    CHECK(m.data.eod_token == 7);
    CHECK(m.data.mask_eod_loss);
    CHECK(m.training.loss_normalization == LossNormalization::tokens);

    CHECK(error_of(kMinimal + "  documents: packed\n") ==
          "x.yaml:3: data.documents: expected one of stream, mask; got \"packed\"");
    CHECK(error_of(kMinimal + "training: {loss_normalization: sequence}\n") ==
          "x.yaml:3: training.loss_normalization: expected one of microbatch, tokens; got "
          "\"sequence\"");
    CHECK(error_of(kMinimal + "  eod_token: -1\n") ==
          "x.yaml:3: data.eod_token: must be >= 0, got -1");
    CHECK(error_of(kMinimal + "  documents: mask\nmodel: {vocab_size: 300}\n") ==
          "x.yaml:4: data.eod_token: 50256 is outside the vocabulary (model.vocab_size 300)");
    CHECK(error_of(kMinimal +
                   "  mask_eod_loss: true\n  eod_token: 300\nmodel: {vocab_size: 300}\n") ==
          "x.yaml:4: data.eod_token: 300 is outside the vocabulary (model.vocab_size 300)");
    CHECK(error_of(kMinimal + "  documents: mask\nmodel: {arch: llama}\n") ==
          "x.yaml: data.eod_token: required with data.documents: mask for a llama model whose "
          "model.init_from names no eos_token_id (config.json) nor eos_token "
          "(tokenizer_config.json)");
    for (const char* mode : {"ring", "ulysses"})
        CHECK(parse(kMinimal + "  documents: mask\n  eod_token: 7\n", "x.yaml",
                    {"parallel.context=2", std::string("parallel.context_mode=") + mode})
                  .data.documents == DocumentMode::mask);
}

TEST_CASE("documents: a llama's eod is its config.json's eos_token_id unless given",
          "[documents][config][hf_folder]") {
    TempDir tmp("documents_eos");
    const std::string dir = tmp / "llama";
    std::filesystem::create_directories(dir);
    const trident::model::HfLlamaConfig hf{100, 32, 2, 4, 2, 48, 16, 10000.0, 1e-6, false};
    std::string json = trident::model::hf_llama_config_json(hf);
    const std::string null_eos = "\"eos_token_id\": null";
    REQUIRE(json.find(null_eos) != std::string::npos);
    std::ofstream(dir + "/config.json")
        << json.replace(json.find(null_eos), null_eos.size(), "\"eos_token_id\": 2");
    const std::string yaml = kMinimal + "  documents: mask\nmodel:\n  init_from: " + dir + "\n";
    CHECK(parse(yaml, "x.yaml").data.eod_token == 2);
    CHECK(parse(yaml, "x.yaml", {"data.eod_token=5"}).data.eod_token == 5);
}

TEST_CASE("documents: a llama's eod from a list, or from tokenizer_config.json",
          "[documents][config][hf_folder]") {
    TempDir tmp("documents_tokenizer_eos");
    const trident::model::HfLlamaConfig hf{100, 32, 2, 4, 2, 48, 16, 10000.0, 1e-6, false};
    const std::string null_eos = "\"eos_token_id\": null";
    // A folder whose config.json says `eos` for eos_token_id, and the tokenizer files given.
    int folders = 0;
    const auto folder = [&](const std::string& eos,
                            const std::vector<std::pair<std::string, std::string>>& files) {
        const std::string dir = tmp / ("llama" + std::to_string(folders++));
        std::filesystem::create_directories(dir);
        std::string json = trident::model::hf_llama_config_json(hf);
        std::ofstream(dir + "/config.json")
            << json.replace(json.find(null_eos), null_eos.size(), "\"eos_token_id\": " + eos);
        for (const auto& [name, text] : files) std::ofstream(dir + "/" + name) << text;
        return kMinimal + "  documents: mask\nmodel:\n  init_from: " + dir + "\n";
    };
    const auto eod = [](const std::string& yaml) { return parse(yaml, "x.yaml").data.eod_token; };
    // Llama 3 instruct's list: its first.
    CHECK(eod(folder("[7, 9]", {})) == 7);
    // None in config.json: tokenizer_config.json's id, or its text's id from its
    // added_tokens_decoder, from tokenizer.json's added_tokens, or from its model's vocab.
    CHECK(eod(folder("null", {{"tokenizer_config.json", R"({"eos_token_id": 11})"}})) == 11);
    CHECK(eod(folder("null", {{"tokenizer_config.json",
                               R"({"eos_token": "</s>", "added_tokens_decoder": {
                                   "1": {"content": "<s>", "special": true},
                                   "2": {"content": "</s>", "special": true}}})"}})) == 2);
    CHECK(eod(folder("null", {{"tokenizer_config.json",
                               R"({"eos_token": {"content": "<|end|>", "lstrip": false}})"},
                              {"tokenizer.json", R"({"added_tokens": [
                                   {"id": 3, "content": "<|begin|>"},
                                   {"id": 4, "content": "<|end|>"}], "model": {"vocab": {}}})"}})) ==
          4);
    CHECK(eod(folder("null", {{"tokenizer_config.json", R"({"eos_token": "</s>"})"},
                              {"tokenizer.json",
                               R"({"added_tokens": [], "model": {"vocab": {"</s>": 6}}})"}})) == 6);
    // A text no table names: one line naming the file and the token.
    const std::string lost = folder("null", {{"tokenizer_config.json", R"({"eos_token": "</s>"})"},
                                             {"tokenizer.json", R"({"model": {"vocab": {}}})"}});
    const std::string said = error_of(lost);
    INFO(said);
    CHECK(said.find("tokenizer_config.json: eos_token \"</s>\" has no id in its "
                    "added_tokens_decoder nor in ") != std::string::npos);
    // Neither file names one: required.
    CHECK(error_of(folder("null", {{"tokenizer_config.json", R"({"bos_token": "<s>"})"}})) ==
          "x.yaml: data.eod_token: required with data.documents: mask for a llama model whose "
          "model.init_from names no eos_token_id (config.json) nor eos_token "
          "(tokenizer_config.json)");
}
