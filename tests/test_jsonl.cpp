// The parts `trident tokenize` reads JSON-lines corpora with: one line's string member
// (io::json::string_member) against the whole-document reader's grammar, plain, gzip and zstd
// files as byte streams (data/byte_source.h: concatenated members and frames, cut-short and
// mislabelled files), and the llm.c shard written as its tokens come (data::TokenShardWriter).
#include <zlib.h>
#include <zstd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <string>
#include <vector>

#include "data/byte_source.h"
#include "data/token_shards.h"
#include "io/json_reader.h"
#include "kernels/error.h"
#include "temp_dir.h"

namespace {

using namespace trident;

// The string of `key`, or "error: <message>".
std::string field(const std::string& line, const std::string& key = "text") {
    std::string out = "kept:";
    try {
        io::json::string_member(line, key, out);
    } catch (const Error& e) {
        REQUIRE(out == "kept:");  // nothing appended on failure
        return std::string("error: ") + e.what();
    }
    return out.substr(5);
}

void write_file(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary) << bytes;
}

std::string gzip(const std::string& text) {
    z_stream z{};
    REQUIRE(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK);
    std::string out(deflateBound(&z, text.size()) + 64, '\0');
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
    z.avail_in = static_cast<uInt>(text.size());
    z.next_out = reinterpret_cast<Bytef*>(out.data());
    z.avail_out = static_cast<uInt>(out.size());
    REQUIRE(deflate(&z, Z_FINISH) == Z_STREAM_END);
    out.resize(z.total_out);
    deflateEnd(&z);
    return out;
}

std::string zstd(const std::string& text) {
    std::string out(ZSTD_compressBound(text.size()), '\0');
    const std::size_t n = ZSTD_compress(out.data(), out.size(), text.data(), text.size(), 3);
    REQUIRE_FALSE(ZSTD_isError(n));
    out.resize(n);
    return out;
}

// The whole stream of `path`, read in pieces of `piece` bytes.
std::string decompressed(const std::string& path, std::size_t piece = 7) {
    const auto source = data::open_byte_source(path);
    std::string out, buffer(piece, '\0');
    for (std::size_t got; (got = source->read(buffer)) > 0;) out.append(buffer, 0, got);
    CHECK(source->read(buffer) == 0);  // and stays at its end
    return out;
}

std::string error_reading(const std::string& path) {
    try {
        decompressed(path, 1 << 16);
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

// Text of `n` lines, varied enough not to compress to nothing.
std::string lines(int n) {
    std::string text;
    for (int i = 0; i < n; ++i)
        text += "{\"text\": \"line " + std::to_string(i * 7919 % 10007) + "\"}\n";
    return text;
}

}  // namespace

TEST_CASE("jsonl: a line's string member, decoded", "[jsonl]") {
    CHECK(field(R"({"text": "hello"})") == "hello");
    CHECK(field(R"(  {"id": 3, "text": "a\nb\t\"q\" \\ \/ \u00e9 \ud83d\ude00", "x": null} )") ==
          "a\nb\t\"q\" \\ / \xc3\xa9 \xf0\x9f\x98\x80");
    CHECK(field("{\"text\": \"caf\xc3\xa9 \xe4\xb8\xad\"}\r") == "caf\xc3\xa9 \xe4\xb8\xad");
    // Other members of every kind are read and dropped; the key is found wherever it stands.
    CHECK(field(R"({"a": {"b": [1, 2.5e-3, -0, true, false, null, {"c": "d"}]}, "text": "t"})") ==
          "t");
    CHECK(field(R"({"text": "", "n": 1})") == "");
    CHECK(field(R"({"content": "c", "text": "t"})", "content") == "c");
}

TEST_CASE("jsonl: a malformed line is named by what is wrong and where", "[jsonl][bad-input]") {
    CHECK(field(R"({"id": 1})") == "error: byte 9: no \"text\" key");
    CHECK(field(R"({"text": 5})") == "error: byte 10: \"text\" is a JSON integer, not a string");
    CHECK(field(R"({"text": null})") == "error: byte 13: \"text\" is a JSON null, not a string");
    CHECK(field(R"({"text": "a", "text": "b"})").starts_with("error: byte 14: duplicate key"));
    CHECK(field(R"({"text": "a")") == "error: byte 12: expected ',' or '}'");
    CHECK(field(R"({"text": "a"} x)") == "error: byte 14: unexpected text after the JSON value");
    CHECK(field(R"({"text": "a",})") == "error: byte 13: expected a string key");
    CHECK(field(R"(["text"])") == "error: byte 0: expected a JSON object");
    CHECK(field("") == "error: byte 0: expected a JSON object");
    CHECK(field("{\"text\": \"a\nb\"}") == "error: byte 11: control character in string");
    CHECK(field("{\"text\": \"\xff\"}") == "error: byte 10: invalid UTF-8");
    CHECK(field(R"({"text": "\ud800"})").starts_with("error: byte 16: high surrogate"));
    CHECK(field(R"({"text": "\x"})") == "error: byte 11: unknown escape");
    CHECK(field(R"({"text": "a", "n": 01})") == "error: byte 20: expected ',' or '}'");
    CHECK(field(R"({"text": "a" "n": 1})") == "error: byte 13: expected ',' or '}'");
    CHECK(field("{}") == "error: byte 2: no \"text\" key");
    CHECK(field(R"({"text": "a", "n": NaN})") == "error: byte 19: unexpected character");
    std::string deep = "{\"text\": \"a\", \"x\": ";
    for (int i = 0; i < 100; ++i) deep += "[";
    CHECK(field(deep).find("nesting deeper than") != std::string::npos);
}

TEST_CASE("jsonl: plain, gzip and zstd files read as the same bytes", "[jsonl]") {
    TempDir tmp("jsonl_sources");
    const std::string a = lines(3000), b = lines(17);
    write_file(tmp / "c.jsonl", a + b);
    // Two gzip members and two zstd frames back to back, as concatenated files are.
    write_file(tmp / "c.jsonl.gz", gzip(a) + gzip(b));
    write_file(tmp / "c.jsonl.zst", zstd(a) + zstd(b));
    CHECK(decompressed(tmp / "c.jsonl") == a + b);
    CHECK(decompressed(tmp / "c.jsonl.gz") == a + b);
    CHECK(decompressed(tmp / "c.jsonl.zst") == a + b);
    CHECK(decompressed(tmp / "c.jsonl.zst", 1 << 20) == a + b);
    const auto source = data::open_byte_source(tmp / "c.jsonl.gz");
    std::string all(1 << 22, '\0');
    source->read(all);
    CHECK(source->consumed() == gzip(a).size() + gzip(b).size());

    write_file(tmp / "empty.jsonl", "");
    CHECK(decompressed(tmp / "empty.jsonl").empty());
    CHECK(data::compression_of("x.json.gz") == data::Compression::gzip);
    CHECK(data::compression_of("x.jsonl.zst") == data::Compression::zstd);
    CHECK(data::compression_of("x.jsonl") == data::Compression::none);
}

TEST_CASE("jsonl: cut-short, corrupt and mislabelled compressed files are named",
          "[jsonl][bad-input]") {
    TempDir tmp("jsonl_bad_sources");
    const std::string text = lines(2000), gz = gzip(text), zst = zstd(text);
    write_file(tmp / "cut.jsonl.gz", gz.substr(0, gz.size() / 2));
    CHECK(error_reading(tmp / "cut.jsonl.gz") ==
          tmp / "cut.jsonl.gz" + ": cut short inside its gzip data");
    write_file(tmp / "cut.jsonl.zst", zst.substr(0, zst.size() - 3));
    CHECK(error_reading(tmp / "cut.jsonl.zst") ==
          tmp / "cut.jsonl.zst" + ": cut short inside its zstd data");
    write_file(tmp / "plain.jsonl.zst", text);
    CHECK(error_reading(tmp / "plain.jsonl.zst") ==
          tmp / "plain.jsonl.zst" +
              ": not zstd data (its name ends in .zst; its first bytes say otherwise)");
    write_file(tmp / "zst.jsonl.gz", zst);
    CHECK(error_reading(tmp / "zst.jsonl.gz").find("not gzip data") != std::string::npos);
    std::string corrupt = gz;
    for (std::size_t i = 20; i < 60; ++i) corrupt[i] = static_cast<char>(corrupt[i] ^ 0x5a);
    write_file(tmp / "corrupt.jsonl.gz", corrupt);
    CHECK(error_reading(tmp / "corrupt.jsonl.gz")
              .starts_with(tmp / "corrupt.jsonl.gz" + ": corrupt gzip data (zlib: "));
    CHECK(error_reading(tmp / "missing.jsonl.zst").find("missing.jsonl.zst") != std::string::npos);
}

TEST_CASE("jsonl: an llm.c shard written as its tokens come reads back", "[jsonl]") {
    TempDir tmp("jsonl_shard");
    std::vector<uint16_t> tokens(100000);
    for (std::size_t i = 0; i < tokens.size(); ++i)
        tokens[i] = static_cast<uint16_t>(i * 31 % 50257);
    {
        data::TokenShardWriter out(tmp / "s.bin");
        for (std::size_t at = 0; at < tokens.size(); at += 777)
            out.append(
                std::span(tokens).subspan(at, std::min<std::size_t>(777, tokens.size() - at)));
        CHECK_FALSE(std::filesystem::exists(tmp / "s.bin"));  // not before finish()
        out.finish();
    }
    const data::TokenShards shard(tmp / "s.bin", 50257, "test");
    REQUIRE(shard.size() == tokens.size());
    std::vector<int32_t> back(tokens.size());
    shard.read(0, back);
    CHECK(std::equal(back.begin(), back.end(), tokens.begin()));
    {
        data::TokenShardWriter abandoned(tmp / "t.bin");
        abandoned.append(tokens);
    }
    CHECK_FALSE(std::filesystem::exists(tmp / "t.bin"));
    CHECK(std::distance(std::filesystem::directory_iterator(tmp.dir), {}) == 1);  // no leftovers
}
