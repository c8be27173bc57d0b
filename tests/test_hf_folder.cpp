// Hugging Face model folders: Llama weights written whole or in shards load back bitwise
// (model/hf_weights.h), a broken index or a config.json feature Trident lacks is refused by
// name (model/hf_llama_config.h), and model.init_from of a folder takes the shape keys left
// out from config.json and holds those given to it (src/config/hf_folder.cpp).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/config.h"
#include "kernels/error.h"
#include "kernels/random.h"
#include "model/hf_llama.h"
#include "model/hf_llama_config.h"
#include "model/hf_weights.h"
#include "temp_dir.h"

namespace {

namespace fs = std::filesystem;
using trident::model::HfLlamaConfig;

// vocab 100 (padded to 128), 2 layers, 4 heads of 8 over 2 key/value heads, SwiGLU 48.
const HfLlamaConfig kConfig{100, 32, 2, 4, 2, 48, 16, 500000.0, 1e-6, false};

// The layout's every real value drawn from a hash, padded vocabulary rows zero.
std::vector<float> llama_params(const trident::model::ParamLayout& layout) {
    std::vector<float> params(layout.total());
    for (std::size_t i = 0; i < params.size(); ++i)
        params[i] = static_cast<float>(trident::kernels::hash64(3, i) % 2001) / 1000.0f - 1.0f;
    for (const auto& t : layout.tensors())
        if (t.offset == layout.wte() || t.offset == layout.head())
            std::fill(params.begin() + static_cast<std::ptrdiff_t>(t.offset + 100 * 32),
                      params.begin() + static_cast<std::ptrdiff_t>(t.offset + t.numel), 0.0f);
    return params;
}

void write_text(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
}

std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}

// The message load_hf_llama throws for `dir`; fails the test if it loads.
std::string load_error(const std::string& dir, const trident::model::ParamLayout& layout) {
    std::vector<float> params(layout.total());
    try {
        trident::model::load_hf_llama(dir, layout, params.data());
    } catch (const trident::Error& e) {
        return e.what();
    }
    FAIL("expected an error loading " << dir);
    return "";
}

// A sharded folder of `params` in `dir`, its shards about 8 KB.
void write_sharded(const std::string& dir, const trident::model::ParamLayout& layout,
                   const std::vector<float>& params) {
    fs::create_directories(dir);
    const auto tensors = trident::model::to_hf_llama_tensors(layout, params.data());
    REQUIRE(trident::model::write_hf_weights(dir, tensors, 8192).size() > 3);
}

}  // namespace

TEST_CASE("hf folder: llama weights whole and in shards load back bitwise", "[hf_folder]") {
    TempDir tmp("hf_bitwise");
    const trident::model::ParamLayout layout(trident::model::hf_llama_shape(kConfig, 16));
    const std::vector<float> params = llama_params(layout);
    const auto tensors = trident::model::to_hf_llama_tensors(layout, params.data());
    fs::create_directories(tmp / "whole");
    CHECK(trident::model::write_hf_weights(tmp / "whole", tensors) ==
          std::vector<std::string>{tmp / "whole/model.safetensors"});
    write_sharded(tmp / "sharded", layout, params);
    CHECK_FALSE(fs::exists(tmp / "sharded/model.safetensors"));
    for (const char* dir : {"whole", "sharded"}) {
        std::vector<float> back(layout.total(), std::nanf(""));
        trident::model::load_hf_llama(tmp / dir, layout, back.data());
        INFO(dir);
        CHECK(std::memcmp(back.data(), params.data(), params.size() * sizeof(float)) == 0);
    }
    // config.json round trip: every field equal (doubles bitwise).
    HfLlamaConfig odd = kConfig;
    odd.norm_eps = 1.0 / 3.0 * 1e-5;
    odd.tied = true;
    write_text(tmp / "config.json", trident::model::hf_llama_config_json(odd));
    CHECK(trident::model::read_hf_llama_config(tmp / "config.json") == odd);
}

TEST_CASE("hf folder: a broken index or an ambiguous folder is refused by name", "[hf_folder]") {
    TempDir tmp("hf_index");
    const trident::model::ParamLayout layout(trident::model::hf_llama_shape(kConfig, 16));
    const std::vector<float> params = llama_params(layout);
    const auto fresh = [&](const std::string& name) {
        write_sharded(tmp / name, layout, params);
        return tmp / name;
    };
    const std::string index = "/model.safetensors.index.json";
    // The shards of a fresh folder (the embedding's 12.8 KB alone in the first), by name.
    std::vector<std::string> shards;
    for (const auto& e : fs::directory_iterator(fresh("listed")))
        if (e.path().filename().string().starts_with("model-"))
            shards.push_back(e.path().filename().string());
    std::sort(shards.begin(), shards.end());
    REQUIRE(shards.size() > 3);
    const std::string first = shards.front();
    SECTION("a missing shard") {
        const std::string dir = fresh("missing");
        fs::remove(dir + "/" + shards[1]);
        CHECK_THAT(load_error(dir, layout), Catch::Contains("names shard " + shards[1]) &&
                                                Catch::Contains("which is missing from"));
    }
    SECTION("a tensor of a shard that the index does not name") {
        const std::string dir = fresh("unnamed");
        std::string text = read_text(dir + index);
        const std::string entry =
            "\"model.layers.0.input_layernorm.weight\": \"" + shards[1] + "\", ";
        const auto at = text.find(entry);
        REQUIRE(at != std::string::npos);
        write_text(dir + index, text.erase(at, entry.size()));
        CHECK_THAT(load_error(dir, layout),
                   Catch::Contains("holds model.layers.0.input_layernorm.weight, which") &&
                       Catch::Contains("does not name"));
    }
    SECTION("the index names a tensor its shard does not hold") {
        const std::string dir = fresh("absent");
        std::string text = read_text(dir + index);
        const std::string map = "\"weight_map\": {";
        text.insert(text.find(map) + map.size(), "\"model.extra.weight\": \"" + first + "\", ");
        write_text(dir + index, text);
        CHECK_THAT(load_error(dir, layout), Catch::Contains("puts model.extra.weight in " + first +
                                                            ", which does not hold it"));
    }
    SECTION("a shard outside the folder") {
        const std::string dir = fresh("outside");
        std::string text = read_text(dir + index);
        const std::string named = "\"" + first + "\"";
        text.replace(text.find(named), named.size(), "\"../x.safetensors\"");
        write_text(dir + index, text);
        CHECK_THAT(load_error(dir, layout), Catch::Contains("does not name a shard file"));
    }
    SECTION("both one file and an index") {
        const std::string dir = fresh("both");
        fs::copy_file(dir + "/" + first, dir + "/model.safetensors");
        CHECK_THAT(load_error(dir, layout),
                   Catch::Contains("holds both model.safetensors and model.safetensors.index"));
    }
}

TEST_CASE(
    "hf folder: config.json features that Trident lacks are refused with one message for each",
    "[hf_folder]") {
    TempDir tmp("hf_features");
    const std::string good = trident::model::hf_llama_config_json(kConfig);
    const auto error_with = [&](const std::string& from, const std::string& to) {
        std::string text = good;
        const auto at = text.find(from);
        REQUIRE(at != std::string::npos);
        write_text(tmp / "config.json", text.replace(at, from.size(), to));
        try {
            trident::model::read_hf_llama_config(tmp / "config.json");
        } catch (const trident::Error& e) {
            return std::string(e.what());
        }
        FAIL("expected an error for " << to);
        return std::string();
    };
    CHECK_THAT(error_with("\"rope_scaling\": null", "\"rope_scaling\": {\"factor\": 8}"),
               Catch::EndsWith("rope_scaling is set (scaled rotary positions), which Trident's "
                               "llama does not implement"));
    CHECK_THAT(error_with("\"attention_bias\": false", "\"attention_bias\": true"),
               Catch::Contains("attention_bias is true (q, k, v, o biases)"));
    CHECK_THAT(error_with("\"mlp_bias\": false", "\"mlp_bias\": true"),
               Catch::Contains("mlp_bias is true (gate, up, down biases)"));
    CHECK_THAT(error_with("\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\""),
               Catch::Contains("hidden_act is \"gelu\""));
    CHECK_THAT(error_with("\"model_type\": \"llama\"", "\"model_type\": \"qwen2\""),
               Catch::Contains("model_type \"qwen2\": Qwen2 has attention biases"));
    CHECK_THAT(error_with("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3"),
               Catch::Contains("num_attention_heads 4 is not a multiple of num_key_value_heads 3"));
    // A head_dim other than hidden_size / num_attention_heads (Qwen3's) is read, not refused;
    // one equal to it is the same as none.
    std::string wide = good;
    wide.replace(wide.find("\"head_dim\": 8"), 13, "\"head_dim\": 16");
    write_text(tmp / "config.json", wide);
    CHECK(trident::model::read_hf_llama_config(tmp / "config.json").head_dim == 16);
    write_text(tmp / "config.json", good);
    CHECK(trident::model::read_hf_llama_config(tmp / "config.json").head_dim == 0);
}

TEST_CASE("hf folder: model.init_from takes the shape from config.json and holds given keys to it",
          "[hf_folder]") {
    using trident::config::ConfigError;
    using trident::config::parse;
    TempDir tmp("hf_config");
    const std::string dir = tmp / "llama";
    fs::create_directories(dir);
    write_text(dir + "/config.json", trident::model::hf_llama_config_json(kConfig));
    const std::string yaml = "data: {train: t.bin}\nmodel:\n  init_from: " + dir + "\n";
    const auto error_of = [&](const std::vector<std::string>& overrides) {
        try {
            parse(yaml, "x.yaml", overrides);
        } catch (const ConfigError& e) {
            return std::string(e.what());
        }
        FAIL("expected a ConfigError");
        return std::string();
    };

    const trident::config::ModelConfig m = parse(yaml, "x.yaml").model;
    CHECK(m.arch == trident::model::Arch::llama);
    CHECK(HfLlamaConfig{m.vocab_size, m.hidden, m.layers, m.heads, m.kv_heads, m.ffn_hidden,
                        m.seq_len, m.rope_theta, m.norm_eps, m.tie_embeddings} == kConfig);
    // Keys that agree are fine, a shorter sequence too.
    CHECK(parse(yaml, "x.yaml", {"model.hidden=32", "model.seq_len=8"}).model.seq_len == 8);
    CHECK(error_of({"model.hidden=64"}) ==
          "--set model.hidden=64: model.hidden: 64, but " + dir +
              "/config.json has hidden_size 32 (leave the key out, or make them agree)");
    CHECK(error_of({"model.norm_eps=1e-5"}) ==
          "--set model.norm_eps=1e-5: model.norm_eps: 1e-05, but " + dir +
              "/config.json has rms_norm_eps 1e-06 (leave the key out, or make them agree)");
    CHECK(error_of({"model.tie_embeddings=true"}).find("tie_word_embeddings false") !=
          std::string::npos);
    CHECK(error_of({"model.seq_len=32"}).find("has max_position_embeddings 16") !=
          std::string::npos);
    CHECK(error_of({"model.arch=gpt2"}).find("model.arch: gpt2, but") != std::string::npos);
    write_text(dir + "/config.json", "{\"model_type\": \"mistral\"}");
    CHECK(error_of({}).find("x.yaml:3: model.init_from: " + dir +
                            "/config.json: model_type \"mistral\"") != std::string::npos);
}
