// Tests of the safetensors reader/writer (src/io/safetensors.h) and the Hugging Face GPT-2
// import/export (model/hf_gpt2.h): round trips, dtype conversion from hand-made bit patterns,
// a file whose bytes are written out literally, and every kind of corrupt file we refuse.
#include <unistd.h>

#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "kernels/error.h"
#include "model/hf_gpt2.h"
#include "model/param_layout.h"

namespace fs = std::filesystem;
using Catch::Contains;
using trident::io::SafetensorsFile;
using trident::io::TensorToWrite;
using trident::kernels::DType;

namespace {

// A fresh directory for one test case, removed with everything in it afterwards.
class TempDir {
public:
    TempDir() {
        static int counter = 0;
        path_ = fs::temp_directory_path() /
                ("trident_st_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
        fs::create_directories(path_);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path_, ec);
    }
    std::string file(const std::string& name) const { return (path_ / name).string(); }

private:
    fs::path path_;
};

void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string u64_le(uint64_t n) {
    std::string s(8, '\0');
    for (auto& c : s) {
        c = static_cast<char>(n & 0xFF);
        n >>= 8;
    }
    return s;
}

// A safetensors file built by hand: length prefix, the header text as given, raw data.
std::string st_bytes(const std::string& header, const std::string& data) {
    return u64_le(header.size()) + header + data;
}

std::string float_bytes(std::initializer_list<float> values) {
    std::string s;
    for (float v : values) s.append(reinterpret_cast<const char*>(&v), sizeof v);
    return s;
}

std::string u16_bytes(std::initializer_list<uint16_t> values) {
    std::string s;
    for (uint16_t v : values) {
        s += static_cast<char>(v & 0xFF);
        s += static_cast<char>(v >> 8);
    }
    return s;
}

// The message SafetensorsFile::open throws for `path`, or "" if it opens.
std::string open_error(const std::string& path) {
    try {
        SafetensorsFile::open(path);
    } catch (const trident::Error& e) {
        return e.what();
    }
    return "";
}

template <typename F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const trident::Error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST_CASE("safetensors: write then read gives back names, shapes, values and metadata",
          "[safetensors]") {
    TempDir dir;
    const std::string path = dir.file("round.safetensors");
    const std::vector<float> a = {1.0f, -2.5f, 3.25f, 1e-30f, -0.0f, 6e20f};
    const std::vector<float> b = {std::numeric_limits<float>::infinity(), 0.1f, -7.0f, 8.0f};
    const float scalar = 42.0f;
    const std::vector<TensorToWrite> tensors = {
        {"z.matrix", {2, 3}, a.data()},
        {"a.vector", {4}, b.data()},
        {"m.scalar", {}, &scalar},
        {"e.empty", {0, 5}, nullptr},
    };
    trident::io::write_safetensors(path, tensors, {{"format", "pt"}, {"note", "quo\"te\\ é\n"}});
    REQUIRE_FALSE(fs::exists(path + ".tmp." + std::to_string(::getpid())));

    // The header length is a multiple of 8 so the data buffer is aligned.
    std::ifstream in(path, std::ios::binary);
    char length[8];
    in.read(length, 8);
    uint64_t n = 0;
    std::memcpy(&n, length, 8);
    CHECK(n % 8 == 0);

    const SafetensorsFile f = SafetensorsFile::open(path);
    // Sorted by name in the header and in the data.
    CHECK(f.names() == std::vector<std::string>{"a.vector", "e.empty", "m.scalar", "z.matrix"});
    CHECK(f.metadata().at("format") == "pt");
    CHECK(f.metadata().at("note") == "quo\"te\\ é\n");
    REQUIRE(f.find("z.matrix") != nullptr);
    CHECK(f.find("z.matrix")->shape == std::vector<int64_t>{2, 3});
    CHECK(f.find("z.matrix")->dtype == DType::f32);
    CHECK(f.find("m.scalar")->shape.empty());
    CHECK(f.find("m.scalar")->numel == 1);
    CHECK(f.find("e.empty")->numel == 0);
    CHECK(f.find("nope") == nullptr);

    const auto ra = f.read_f32("z.matrix");
    REQUIRE(ra.size() == a.size());
    CHECK(std::memcmp(ra.data(), a.data(), a.size() * 4) == 0);  // bit-exact, -0.0 included
    CHECK(f.read_f32("a.vector") == b);
    CHECK(f.read_f32("m.scalar") == std::vector<float>{42.0f});
    CHECK(f.read_f32("e.empty").empty());
    CHECK_THAT(error_of([&] { f.read_f32("nope"); }),
               Contains(path) && Contains("no tensor named"));

    // Overwriting an existing file replaces it.
    const std::vector<TensorToWrite> one = {{"only", {1}, &scalar}};
    trident::io::write_safetensors(path, one);
    CHECK(SafetensorsFile::open(path).names() == std::vector<std::string>{"only"});
    CHECK(SafetensorsFile::open(path).metadata().empty());
}

TEST_CASE("safetensors: writer refuses duplicate names", "[safetensors]") {
    TempDir dir;
    const float x = 1.0f;
    const std::vector<TensorToWrite> dup = {{"w", {1}, &x}, {"w", {1}, &x}};
    const std::string path = dir.file("dup.safetensors");
    CHECK_THAT(error_of([&] { trident::io::write_safetensors(path, dup); }),
               Contains(path) && Contains("appears twice"));
    CHECK_FALSE(fs::exists(path));
}

TEST_CASE("safetensors: reads a file whose bytes are written out by hand", "[safetensors]") {
    // As another writer might lay it out: metadata last, whitespace, a \u escape in a name, an
    // unpadded header length.
    TempDir dir;
    const std::string path = dir.file("hand.safetensors");
    const std::string header =
        "{ \"w\\u00e9ight\" : {\"dtype\":\"F32\", \"shape\":[2, 1], \"data_offsets\":[8,16]},\n"
        "  \"bias\": {\"data_offsets\":[0,8], \"shape\":[2], \"dtype\":\"F32\"},\n"
        "  \"__metadata__\": {\"format\": \"pt\"} }";
    write_bytes(path, st_bytes(header, float_bytes({0.5f, -1.0f, 3.0f, 4.5f})));

    const SafetensorsFile f = SafetensorsFile::open(path);
    CHECK(f.names() == std::vector<std::string>{"bias", "w\xC3\xA9ight"});  // data order
    CHECK(f.read_f32("bias") == std::vector<float>{0.5f, -1.0f});
    CHECK(f.read_f32("w\xC3\xA9ight") == std::vector<float>{3.0f, 4.5f});
    CHECK(f.find("w\xC3\xA9ight")->shape == std::vector<int64_t>{2, 1});
    CHECK(f.metadata().at("format") == "pt");
}

TEST_CASE("safetensors: F16 and BF16 convert exactly to float", "[safetensors]") {
    CHECK(trident::kernels::from_f16(0x3C00) == 1.0f);
    CHECK(trident::kernels::from_f16(0xC000) == -2.0f);
    CHECK(trident::kernels::from_f16(0x7BFF) == 65504.0f);               // largest half
    CHECK(trident::kernels::from_f16(0x0400) == std::ldexp(1.0f, -14));  // smallest normal
    CHECK(trident::kernels::from_f16(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
    CHECK(trident::kernels::from_f16(0x03FF) == std::ldexp(1023.0f, -24));
    CHECK(trident::kernels::from_f16(0x3555) == 0.333251953125f);
    CHECK(std::signbit(trident::kernels::from_f16(0x8000)));
    CHECK(trident::kernels::from_f16(0xFC00) == -std::numeric_limits<float>::infinity());
    CHECK(std::isnan(trident::kernels::from_f16(0x7E00)));
    CHECK(trident::kernels::from_bf16(0x3F80) == 1.0f);
    CHECK(trident::kernels::from_bf16(0xC040) == -3.0f);
    CHECK(trident::kernels::from_bf16(0x3EAB) == 0.333984375f);
    CHECK(trident::kernels::from_bf16(0x7F80) == std::numeric_limits<float>::infinity());
    CHECK(trident::kernels::from_bf16(0x0001) == std::bit_cast<float>(0x00010000u));

    TempDir dir;
    const std::string path = dir.file("half.safetensors");
    const std::string header =
        "{\"h\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[0,8]},"
        "\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[8,14]},"
        "\"i\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[14,18]}}";
    write_bytes(path, st_bytes(header, u16_bytes({0x3C00, 0xC000, 0x0001, 0x7BFF}) +
                                           u16_bytes({0x3F80, 0xC040, 0x3EAB}) +
                                           std::string("\1\0\0\0", 4)));
    const SafetensorsFile f = SafetensorsFile::open(path);
    CHECK(f.find("h")->dtype == DType::f16);
    CHECK(f.find("b")->dtype == DType::bf16);
    CHECK(f.read_f32("h") == std::vector<float>{1.0f, -2.0f, std::ldexp(1.0f, -24), 65504.0f});
    CHECK(f.read_f32("b") == std::vector<float>{1.0f, -3.0f, 0.333984375f});
    CHECK_THAT(error_of([&] { f.read_f32("i"); }),
               Contains(path) && Contains("dtype I32") && Contains("only F32, F16 and BF16"));
}

TEST_CASE("safetensors: every kind of corrupt file is refused with a message naming it",
          "[safetensors]") {
    TempDir dir;
    int index = 0;
    // Writes `bytes` to a new file and returns the error opening it.
    auto refused = [&](const std::string& bytes) {
        const std::string path = dir.file("bad" + std::to_string(index++) + ".safetensors");
        write_bytes(path, bytes);
        const std::string msg = open_error(path);
        CHECK_THAT(msg, Contains(path));
        return msg;
    };
    const std::string ok_entry = "{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}";
    const std::string data8 = float_bytes({1.0f, 2.0f});

    SECTION("missing file") {
        CHECK_THAT(open_error(dir.file("absent.safetensors")), Contains("cannot open"));
    }
    SECTION("too short for the length field") {
        CHECK_THAT(refused("abc"), Contains("too short"));
    }
    SECTION("header length past the end of the file") {
        CHECK_THAT(refused(u64_le(1000) + "{}"), Contains("header length 1000 runs past the end"));
        CHECK_THAT(refused(u64_le(~0ull) + "{}"), Contains("runs past the end"));
    }
    SECTION("header is not JSON") {
        CHECK_THAT(refused(st_bytes("{\"a\": garbage}", "")), Contains("invalid header JSON"));
        CHECK_THAT(refused(st_bytes("{\"a\": {", "")), Contains("invalid header JSON"));
        CHECK_THAT(refused(st_bytes("", "")), Contains("invalid header JSON"));
        CHECK_THAT(refused(st_bytes("{} x", "")), Contains("after the JSON value"));
        CHECK_THAT(refused(st_bytes("{\"a\\q\":1}", "")), Contains("unknown escape"));
        CHECK_THAT(refused(st_bytes("{\"\\ud800\":1}", "")), Contains("surrogate"));
        CHECK_THAT(refused(st_bytes("{\"\xC0\xAF\":1}", "")), Contains("invalid UTF-8"));
        CHECK_THAT(refused(st_bytes(std::string(1000, '[') + std::string(1000, ']'), "")),
                   Contains("nesting"));
        CHECK_THAT(refused(st_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],"
                                    "\"data_offsets\":[0,0]}}",
                                    "")),
                   Contains("64-bit range"));
        CHECK_THAT(refused(st_bytes("[1, 2]", "")), Contains("must be a JSON object"));
    }
    SECTION("duplicate tensor names") {
        CHECK_THAT(refused(st_bytes("{\"a\":" + ok_entry + ",\"a\":" + ok_entry + "}", data8)),
                   Contains("duplicate key \"a\""));
    }
    SECTION("unknown dtype") {
        CHECK_THAT(refused(st_bytes(
                       "{\"a\":{\"dtype\":\"F24\",\"shape\":[2],\"data_offsets\":[0,8]}}", data8)),
                   Contains("tensor \"a\": unknown dtype \"F24\""));
    }
    SECTION("shape and dtype do not match the offsets") {
        CHECK_THAT(refused(st_bytes(
                       "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", data8)),
                   Contains("need 12 bytes, but data_offsets [0, 8] hold 8"));
        CHECK_THAT(refused(st_bytes(
                       "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", data8)),
                   Contains("non-negative"));
        CHECK_THAT(
            refused(st_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}",
                             data8)),
            Contains("non-negative integer"));
        CHECK_THAT(
            refused(st_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],"
                             "\"data_offsets\":[0,8]}}",
                             data8)),
            Contains("too large"));
        CHECK_THAT(refused(st_bytes(
                       "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", data8)),
                   Contains("end before they begin"));
    }
    SECTION("malformed entries") {
        CHECK_THAT(refused(st_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", data8)),
                   Contains("missing field \"data_offsets\""));
        CHECK_THAT(
            refused(st_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],"
                             "\"extra\":1}}",
                             data8)),
            Contains("unknown field \"extra\""));
        CHECK_THAT(refused(st_bytes(
                       "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", data8)),
                   Contains("two integers"));
        CHECK_THAT(refused(st_bytes("{\"a\":[1]}", data8)), Contains("expected an object"));
        CHECK_THAT(refused(st_bytes("{\"__metadata__\":{\"k\":1}}", "")),
                   Contains("must be a string"));
    }
    SECTION("offsets beyond the data buffer, or data truncated") {
        CHECK_THAT(
            refused(st_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[100,108]}}",
                             data8)),
            Contains("run past the end of the 8-byte data buffer"));
        // The header promises 4 floats, the file stops after 2.
        CHECK_THAT(refused(st_bytes(
                       "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", data8)),
                   Contains("file truncated"));
    }
    SECTION("overlapping data, holes, trailing bytes") {
        const std::string data16 = data8 + data8;
        CHECK_THAT(
            refused(st_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},"
                             "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
                             data16)),
            Contains("\"a\" and \"b\" overlap"));
        CHECK_THAT(
            refused(st_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
                             data16)),
            Contains("bytes 0 to 8 of the data buffer belong to no tensor"));
        CHECK_THAT(refused(st_bytes("{\"a\":" + ok_entry + "}", data16)),
                   Contains("trailing bytes"));
    }
}

TEST_CASE("safetensors: damaged copies of a valid file never crash the reader", "[safetensors]") {
    // Every truncation and many random byte flips: open() either succeeds (and reads every
    // tensor) or throws trident::Error; nothing else.
    TempDir dir;
    const std::string good = dir.file("good.safetensors");
    const std::vector<float> a(24, 1.5f), b(8, -2.0f);
    const std::vector<TensorToWrite> tensors = {{"alpha", {4, 6}, a.data()},
                                                {"beta", {8}, b.data()}};
    trident::io::write_safetensors(good, tensors, {{"format", "pt"}});
    std::ifstream in(good, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

    const std::string path = dir.file("damaged.safetensors");
    auto survives = [&](const std::string& damaged) {
        write_bytes(path, damaged);
        try {
            const SafetensorsFile f = SafetensorsFile::open(path);
            for (const auto& t : f.tensors())
                if (t.dtype == DType::f32 || t.dtype == DType::f16 || t.dtype == DType::bf16)
                    (void)f.read_f32(t.name);
        } catch (const trident::Error&) {
        }
    };
    for (std::size_t n = 0; n < bytes.size(); ++n) survives(bytes.substr(0, n));
    std::mt19937 rng(7);
    std::uniform_int_distribution<std::size_t> where(0, bytes.size() - 1);
    std::uniform_int_distribution<int> value(0, 255);
    for (int trial = 0; trial < 2000; ++trial) {
        std::string damaged = bytes;
        for (int k = 0; k < 3; ++k) damaged[where(rng)] = static_cast<char>(value(rng));
        survives(damaged);
    }
    SUCCEED();
}

// ---------------------------------------------------------------------------------------------
// Hugging Face GPT-2

namespace {

using trident::model::GptShape;
using trident::model::ParamLayout;

const GptShape kTiny = {/*vocab=*/100, /*padded_vocab=*/128, /*max_seq=*/16, /*layers=*/2,
                        /*hidden=*/32, /*heads=*/4,          /*ffn=*/128};

// Distinct values everywhere except wte's padded rows, which are zero as in a real model.
std::vector<float> tiny_params(const ParamLayout& layout) {
    std::vector<float> p(layout.total());
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    for (auto& v : p) v = normal(rng);
    const auto& s = layout.shape();
    std::fill_n(p.begin() + static_cast<std::ptrdiff_t>(layout.wte()) + s.vocab * s.hidden,
                (s.padded_vocab - s.vocab) * s.hidden, 0.0f);
    return p;
}

struct OwnedTensor {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> data;
};

std::vector<OwnedTensor> read_all(const std::string& path) {
    const SafetensorsFile f = SafetensorsFile::open(path);
    std::vector<OwnedTensor> out;
    for (const auto& t : f.tensors()) out.push_back({t.name, t.shape, f.read_f32(t.name)});
    return out;
}

void write_all(const std::string& path, const std::vector<OwnedTensor>& tensors) {
    std::vector<TensorToWrite> list;
    for (const auto& t : tensors) list.push_back({t.name, t.shape, t.data.data()});
    trident::io::write_safetensors(path, list, {{"format", "pt"}});
}

OwnedTensor* find(std::vector<OwnedTensor>& tensors, const std::string& name) {
    for (auto& t : tensors)
        if (t.name == name) return &t;
    return nullptr;
}

std::string load_error(const std::string& path, const ParamLayout& layout) {
    std::vector<float> p(layout.total());
    return error_of([&] { trident::model::load_hf_gpt2(path, layout, p.data()); });
}

}  // namespace

TEST_CASE("hf_gpt2: export then import reproduces the parameter buffer", "[safetensors]") {
    TempDir dir;
    const ParamLayout layout(kTiny);
    const std::vector<float> params = tiny_params(layout);
    const std::string path = dir.file("gpt2.safetensors");
    trident::model::save_hf_gpt2(path, layout, params.data());

    // HF names and shapes: prefix, Conv1D [in, out], vocab unpadded, no lm_head.
    const SafetensorsFile f = SafetensorsFile::open(path);
    CHECK(f.metadata().at("format") == "pt");
    CHECK(f.tensors().size() == layout.tensors().size());
    CHECK(f.find("lm_head.weight") == nullptr);
    CHECK(f.find("transformer.wte.weight")->shape == std::vector<int64_t>{100, 32});
    CHECK(f.find("transformer.wpe.weight")->shape == std::vector<int64_t>{16, 32});
    CHECK(f.find("transformer.h.0.attn.c_attn.weight")->shape == std::vector<int64_t>{32, 96});
    CHECK(f.find("transformer.h.0.attn.c_attn.bias")->shape == std::vector<int64_t>{96});
    CHECK(f.find("transformer.h.1.mlp.c_fc.weight")->shape == std::vector<int64_t>{32, 128});
    CHECK(f.find("transformer.h.1.mlp.c_proj.weight")->shape == std::vector<int64_t>{128, 32});
    CHECK(f.find("transformer.ln_f.bias")->shape == std::vector<int64_t>{32});

    // The transpose: HF c_fc[i][o] is our fc1[o][i].
    const auto hf_fc = f.read_f32("transformer.h.1.mlp.c_fc.weight");
    const float* ours =
        params.data() + layout.find("h.1.mlp.c_fc.weight")->offset;  // (F=128, H=32)
    for (int o = 0; o < 128; ++o)
        for (int i = 0; i < 32; ++i)
            REQUIRE(hf_fc[static_cast<std::size_t>(i * 128 + o)] == ours[o * 32 + i]);

    std::vector<float> back(layout.total(), std::nanf(""));
    trident::model::load_hf_gpt2(path, layout, back.data());
    CHECK(std::memcmp(back.data(), params.data(), params.size() * sizeof(float)) == 0);
}

TEST_CASE("hf_gpt2: import without the transformer. prefix, mask buffers ignored",
          "[safetensors]") {
    TempDir dir;
    const ParamLayout layout(kTiny);
    const std::vector<float> params = tiny_params(layout);
    const std::string exported = dir.file("gpt2.safetensors");
    trident::model::save_hf_gpt2(exported, layout, params.data());

    // As HF's own gpt2 checkpoint: bare names, plus the causal-mask buffers of each block.
    auto tensors = read_all(exported);
    for (auto& t : tensors) t.name = t.name.substr(std::string("transformer.").size());
    for (int l = 0; l < 2; ++l) {
        const std::string p = "h." + std::to_string(l) + ".attn.";
        tensors.push_back({p + "bias", {1, 1, 16, 16}, std::vector<float>(256, 1.0f)});
        tensors.push_back({p + "masked_bias", {}, {-1e4f}});
    }
    const std::string bare = dir.file("bare.safetensors");
    write_all(bare, tensors);

    std::vector<float> back(layout.total(), std::nanf(""));
    trident::model::load_hf_gpt2(bare, layout, back.data());
    CHECK(std::memcmp(back.data(), params.data(), params.size() * sizeof(float)) == 0);

    SECTION("a name given both with and without the prefix is refused") {
        auto both = tensors;
        both.push_back({"transformer.ln_f.bias", {32}, std::vector<float>(32, 0.0f)});
        write_all(bare, both);
        CHECK_THAT(load_error(bare, layout), Contains("both ln_f.bias and transformer.ln_f.bias"));
    }
}

TEST_CASE("hf_gpt2: wpe may have more positions than seq_len, not fewer", "[safetensors]") {
    TempDir dir;
    GptShape long_shape = kTiny;
    long_shape.max_seq = 64;
    const ParamLayout long_layout(long_shape), layout(kTiny);
    const std::vector<float> params = tiny_params(long_layout);
    const std::string path = dir.file("long.safetensors");
    trident::model::save_hf_gpt2(path, long_layout, params.data());

    std::vector<float> back(layout.total());
    trident::model::load_hf_gpt2(path, layout, back.data());
    const float* wpe = params.data() + long_layout.wpe();
    CHECK(std::equal(wpe, wpe + 16 * 32, back.data() + layout.wpe()));
    const auto h0 = layout.find("h.0.attn.c_attn.weight");
    CHECK(std::equal(
        back.begin() + static_cast<std::ptrdiff_t>(h0->offset), back.end(),
        params.begin() + static_cast<std::ptrdiff_t>(long_layout.find(h0->name)->offset)));

    // A 16-position checkpoint cannot serve seq_len 64.
    const std::string short_path = dir.file("short.safetensors");
    trident::model::save_hf_gpt2(short_path, layout, back.data());
    CHECK_THAT(
        load_error(short_path, long_layout),
        Contains(short_path) &&
            Contains("transformer.wpe.weight has shape [16, 32], expected [64, 32] or more rows") &&
            Contains("seq_len=64"));
}

TEST_CASE("hf_gpt2: wrong shapes, missing and unexpected tensors are named", "[safetensors]") {
    TempDir dir;
    const ParamLayout layout(kTiny);
    const std::vector<float> params = tiny_params(layout);
    const std::string path = dir.file("gpt2.safetensors");
    trident::model::save_hf_gpt2(path, layout, params.data());
    auto tensors = read_all(path);
    const std::string edited = dir.file("edited.safetensors");

    SECTION("a checkpoint of another width") {
        GptShape wide = kTiny;
        wide.hidden = 48;
        wide.ffn = 192;
        CHECK_THAT(
            load_error(path, ParamLayout(wide)),
            Contains(path) &&
                Contains("transformer.wte.weight has shape [100, 32], expected [100, 48] for "
                         "vocab_size=100, hidden=48"));
    }
    SECTION("one block tensor of the wrong shape") {
        OwnedTensor* t = find(tensors, "transformer.h.0.attn.c_attn.weight");
        t->shape = {96, 32};  // stored as [out, in] by mistake
        write_all(edited, tensors);
        CHECK_THAT(
            load_error(edited, layout),
            Contains(edited) &&
                Contains("transformer.h.0.attn.c_attn.weight has shape [96, 32], expected [32, 96] "
                         "for hidden=32 (check model."));
    }
    SECTION("a missing tensor") {
        std::erase_if(tensors, [](const OwnedTensor& t) {
            return t.name == "transformer.h.1.mlp.c_fc.bias";
        });
        write_all(edited, tensors);
        CHECK_THAT(load_error(edited, layout),
                   Contains(edited) && Contains("missing 1 tensor(s): h.1.mlp.c_fc.bias"));
    }
    SECTION("more layers than the model") {
        GptShape shallow = kTiny;
        shallow.layers = 1;
        CHECK_THAT(load_error(path, ParamLayout(shallow)),
                   Contains(path) && Contains("unexpected 12 tensor(s): transformer.h.1.") &&
                       Contains("layers=1"));
    }
    SECTION("a dtype that is not floating point") {
        // Patch F32 to I32 in the header: same element size, so the file stays well formed.
        std::ifstream in(path, std::ios::binary);
        std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        const std::string key = "\"transformer.ln_f.bias\":{\"dtype\":\"F32\"";
        const auto at = bytes.find(key);
        REQUIRE(at != std::string::npos);
        bytes[at + key.size() - 4] = 'I';
        write_bytes(edited, bytes);
        CHECK_THAT(load_error(edited, layout),
                   Contains(edited) &&
                       Contains("transformer.ln_f.bias has dtype I32, expected F32, F16 or BF16"));
    }
}

TEST_CASE("hf_gpt2: a tied lm_head is accepted, an untied one refused", "[safetensors]") {
    TempDir dir;
    const ParamLayout layout(kTiny);
    const std::vector<float> params = tiny_params(layout);
    const std::string path = dir.file("gpt2.safetensors");
    trident::model::save_hf_gpt2(path, layout, params.data());
    auto tensors = read_all(path);
    OwnedTensor lm_head = *find(tensors, "transformer.wte.weight");
    lm_head.name = "lm_head.weight";
    const std::string with_head = dir.file("head.safetensors");

    tensors.push_back(lm_head);
    write_all(with_head, tensors);
    std::vector<float> back(layout.total());
    trident::model::load_hf_gpt2(with_head, layout, back.data());
    CHECK(back == params);

    tensors.back().data[17] += 1.0f;
    write_all(with_head, tensors);
    CHECK_THAT(load_error(with_head, layout),
               Contains(with_head) && Contains("lm_head.weight differs from wte.weight") &&
                   Contains("ties the LM head to the token embedding"));
}
