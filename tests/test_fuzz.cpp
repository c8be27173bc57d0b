// Fuzz tests of the parsers of untrusted input: the YAML config, the safetensors header, the
// llm.c shard header, the Megatron .idx, a checkpoint's manifest.json, a tokenizer.json, a line
// of a JSON-lines corpus and a gzip or zstd corpus file. Each
// feeds a few thousand mutated forms of valid seed files (tests/fuzz_mutator.h;
// TRIDENT_FUZZ_ITERATIONS sets how many) through the parser as a run meets them, from disk where a
// run reads a file. Every input must be accepted or refused with one trident::Error of one
// non-empty line: any other exception fails the test, and under scripts/sanitize.sh
// (AddressSanitizer and UndefinedBehaviorSanitizer) so does any out-of-bounds access, overflow or
// leak.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <typeinfo>
#include <vector>

#include "config/config.h"
#include "data/byte_source.h"
#include "data/megatron_dataset.h"
#include "data/token_shards.h"
#include "data/tokenizer.h"
#include "fuzz_mutator.h"
#include "io/json_reader.h"
#include "io/safetensors.h"
#include "kernels/error.h"
#include "small_tokenizer_json.h"
#include "temp_dir.h"
#include "train/checkpoint_manifest.h"

namespace {

namespace fs = std::filesystem;
using namespace trident;

int iterations() {
    const char* text = std::getenv("TRIDENT_FUZZ_ITERATIONS");
    return text ? std::max(1, std::atoi(text)) : 3000;
}

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}

// A new file each time: truncating one in place makes some filesystems (ext4) flush it.
void write_file(const std::string& path, const std::string& bytes) {
    fs::remove(path);
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Printable form of an input for a failure's message.
std::string escaped(const std::string& input) {
    std::string out;
    for (unsigned char c : input.substr(0, 400)) {
        if (c >= 0x20 && c < 0x7F && c != '\\') {
            out += static_cast<char>(c);
        } else {
            char hex[8];
            std::snprintf(hex, sizeof hex, "\\x%02x", c);
            out += hex;
        }
    }
    return out;
}

// Runs `parse` on every seed (each must be accepted) and on iterations() mutated inputs.
template <typename Parse>
void fuzz_parser(uint64_t seed, const std::vector<std::string>& seeds,
                 std::vector<std::string> tokens, Parse parse) {
    for (const std::string& s : seeds) REQUIRE_NOTHROW(parse(s));
    fuzz::Mutator mutator(seed, std::move(tokens));
    int accepted = 0, refused = 0;
    const int n = iterations();
    for (int i = 0; i < n; ++i) {
        const std::string input = mutator.mutate(seeds);
        try {
            parse(input);
            ++accepted;
        } catch (const Error& e) {
            const std::string message = e.what();
            if (message.empty() || message.find('\n') != std::string::npos)
                FAIL("iteration " << i << ": not one line: '" << message
                                  << "'\ninput: " << escaped(input));
            ++refused;
        } catch (const std::exception& e) {
            FAIL("iteration " << i << ": " << typeid(e).name() << ": " << e.what()
                              << "\ninput: " << escaped(input));
        }
    }
    INFO(accepted << " accepted, " << refused << " refused");
    // The mutations reach both sides: inputs still valid and inputs the parser refuses.
    CHECK(accepted > 0);
    CHECK(refused > n / 10);
}

const std::vector<std::string> kJsonTokens = {"{",        "}",
                                              "[",        "]",
                                              ":",        ",",
                                              "\"",       "\\",
                                              "\\u0000",  "\\ud800",
                                              "-1",       "-0",
                                              "1e999",    "99999999999999999999",
                                              "0.5",      "null",
                                              "true",     "\"__metadata__\"",
                                              "\xc3\x28", "\xf0\x9f\x98"};

}  // namespace

TEST_CASE("fuzz: the YAML config", "[fuzz]") {
    std::vector<std::string> seeds = {
        read_file(TRIDENT_SOURCE_DIR "/configs/default.yaml"),
        "model: {vocab_size: 300, seq_len: 16, layers: 2, hidden: 32, heads: 4}\n"
        "parallel: {pipeline: 2, stage_layers: [1, 1], schedule: gpipe}\n"
        "training: {precision: bf16, lr: 3.0e-4, collective_timeout: 5,\n"
        "  lora: {rank: 4, alpha: 8, dropout: 0.1, targets: [qkv, fc], init_from: a.st}}\n"
        "data:\n  train:\n    - {path: a.bin, weight: 0.7}\n    - {path: b.bin, weight: 0.3}\n"
        "checkpoint: {dir: ck, on_error: continue, allow_data_change: true}\n"
        "logging: {metrics: m.jsonl, on_error: continue}\ndevice: cpu\n"};
    REQUIRE(!seeds[0].empty());
    fuzz_parser(1, seeds,
                {":",    " ",          "\n",     "  ",        "- ",    "{",
                 "}",    "[",          "]",      ",",         "#",     "&a ",
                 "*a",   "!!binary ",  "<<: ",   "? ",        "|\n",   "'",
                 "\"",   "~",          "null",   "-1",        "1e999", "0x10",
                 ".inf", "2147483648", "model:", "training:", "\t",    "%YAML 1.2\n---\n"},
                [](const std::string& text) {
                    config::parse(text, "fuzz.yaml", {}, config::Purpose::plan);
                });
}

TEST_CASE("fuzz: the safetensors header", "[fuzz]") {
    TempDir dir("fuzz_st");
    const std::vector<float> a = {1, 2, 3, 4, 5, 6};
    const std::vector<uint16_t> b = {0x3F80, 0x4000};
    const std::vector<io::TensorToWrite> tensors = {
        {"a", {2, 3}, a.data(), kernels::DType::f32},
        {"b", {2}, b.data(), kernels::DType::bf16},
        {"empty", {0, 4}, nullptr, kernels::DType::f16}};
    io::write_safetensors(dir / "seed.safetensors", tensors, {{"format", "pt"}});
    const std::string path = dir / "x.safetensors";
    fuzz_parser(2, {read_file(dir / "seed.safetensors")}, kJsonTokens,
                [&](const std::string& bytes) {
                    write_file(path, bytes);
                    const io::SafetensorsFile file = io::SafetensorsFile::open(path);
                    std::vector<char> raw;
                    for (const io::TensorInfo& t : file.tensors()) {
                        raw.resize(t.data_end - t.data_begin);
                        file.read_raw(t, raw);
                        if (t.dtype == kernels::DType::f32 || t.dtype == kernels::DType::bf16 ||
                            t.dtype == kernels::DType::f16)
                            file.read_f32(t.name);
                    }
                });
}

TEST_CASE("fuzz: the llm.c shard header", "[fuzz]") {
    TempDir dir("fuzz_shard");
    std::vector<uint16_t> tokens(200);
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i * 7 % 300);
    data::write_token_shard(dir / "seed.bin", tokens);
    const std::string path = dir / "x.bin";
    fuzz_parser(3, {read_file(dir / "seed.bin")}, {}, [&](const std::string& bytes) {
        write_file(path, bytes);
        const data::TokenShards shards(path, 300, "data.train");
        std::vector<int32_t> out(std::min<std::size_t>(shards.size(), 16));
        shards.read(shards.size() - out.size(), out);
    });
}

TEST_CASE("fuzz: the Megatron index", "[fuzz]") {
    TempDir dir("fuzz_idx");
    {
        data::MegatronWriter writer(dir / "seed");
        std::vector<uint16_t> doc;
        for (int d = 0; d < 6; ++d) {
            doc.assign(static_cast<std::size_t>(3 + 5 * d), static_cast<uint16_t>(d * 11));
            writer.add_document(doc);
        }
        writer.finish();
    }
    fs::copy_file(dir / "seed.bin", dir / "x.bin");
    const std::string prefix = dir / "x";
    fuzz_parser(4, {read_file(dir / "seed.idx")}, {"MMIDIDX", std::string(8, '\0')},
                [&](const std::string& bytes) {
                    write_file(prefix + ".idx", bytes);
                    const data::MegatronDataset dataset(prefix, 300, "data.train");
                    std::vector<int32_t> out(std::min<std::size_t>(dataset.size(), 16));
                    dataset.read(dataset.size() - out.size(), out);
                });
}

TEST_CASE("fuzz: a checkpoint's manifest.json", "[fuzz]") {
    TempDir dir("fuzz_manifest");
    train::Manifest m;
    m.step = 40;
    m.samples_consumed = 1280;
    m.seed = 1234;
    m.adam_step = 40;
    m.loss_scale = 65536;
    m.shape = model::GptShape{300, 384, 16, 2, 32, 4, 128, 4};
    m.layout = train::CheckpointLayout{2, 1, 2, 1, "1f1b", 1, 1000, {1, 1}};
    m.precision = "fp32";
    m.files = {
        {"config.yaml", -1, -1, -1, 120, std::string(64, 'a'), ""},
        {"pp0_tp0_dp0.safetensors", 0, 0, 0, 4096, std::string(64, 'b'), std::string(64, 'c')}};
    m.data = {{"data.train", "data/train.bin", 6000, std::string(64, 'd')}};
    const std::string seed = train::manifest_json(m);
    fuzz_parser(5, {seed}, kJsonTokens, [&](const std::string& text) {
        write_file(dir / "manifest.json", text);
        const train::Manifest read = train::read_manifest(dir.dir.string());
        train::describe_data_changes(read.data, m.data);
    });
}

TEST_CASE("fuzz: a tokenizer.json", "[fuzz]") {
    TempDir dir("fuzz_tokenizer");
    const std::string path = dir / "tokenizer.json";
    std::vector<std::string> tokens = kJsonTokens;
    for (const char* t : {"\"<s>\"", "\"ab\"", "\"a b\"", "\"Sequence\"", "\"Split\"", "\"BPE\"",
                          "\"TemplateProcessing\"", "\"ids\": [", "\"\\u0120\"", "256", "261"})
        tokens.push_back(t);
    fuzz_parser(6, {small_tokenizer::json()}, tokens, [&](const std::string& text) {
        write_file(path, text);
        const auto tokenizer = data::make_tokenizer(path);
        std::vector<int32_t> ids;
        tokenizer->encode("x<s>ab a\nxyz<|endoftext|> 123", ids);
        tokenizer->decode(ids);
    });
}

TEST_CASE("fuzz: a line of a JSON-lines corpus", "[fuzz]") {
    const std::vector<std::string> seeds = {
        R"({"text": "In the beginning\nGod \u00e9\ud83d\ude00", "id": 1, "score": 2.5e-3})",
        R"({"id": "a", "meta": {"url": "x", "tags": [1, null, true, false, []]}, "text": "b"})",
        "{\"text\": \"caf\xc3\xa9 \\\"quoted\\\" \\\\ \\/\", \"n\": -0}"};
    fuzz_parser(7, seeds, kJsonTokens, [&](const std::string& line) {
        std::string text = "before";
        try {
            io::json::string_member(line, "text", text);
        } catch (const Error&) {
            REQUIRE(text == "before");  // a refused line leaves nothing behind
            throw;
        }
    });
}

TEST_CASE("fuzz: a gzip or zstd corpus file", "[fuzz]") {
    TempDir dir("fuzz_corpus");
    std::string lines;
    for (int i = 0; i < 200; ++i) lines += "{\"text\": \"line " + std::to_string(i * 37) + "\"}\n";
    for (const std::string name : {"seed.jsonl.gz", "seed.jsonl.zst"}) {
        const std::string compress = name.ends_with(".gz") ? "gzip -c" : "zstd -q -c";
        write_file(dir / "seed.jsonl", lines);
        REQUIRE(std::system((compress + " " + dir / "seed.jsonl" + " > " + dir / name).c_str()) ==
                0);
        const std::string path = dir / ("x" + name.substr(4));
        fuzz_parser(name.ends_with(".gz") ? 8 : 9, {read_file(dir / name)}, {},
                    [&](const std::string& bytes) {
                        write_file(path, bytes);
                        const auto source = data::open_byte_source(path);
                        std::string buffer(4096, '\0');
                        while (source->read(buffer) > 0) {
                        }
                    });
    }
}
