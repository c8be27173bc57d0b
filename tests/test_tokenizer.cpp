// The GPT-2 tokenizer (data/gpt2_tokenizer.h, data/pretokenize.h): ids known from the
// JavaScript encoder, the pre-tokenizer's pieces, exact round trips of random valid and invalid
// UTF-8, concurrent encoding, and clear errors on broken files. The comparison with the
// JavaScript encoder on many strings and on the Bible is tests/python/test_tokenizer_js.py.
//
// The GPT-2 files come from scripts/fetch_gpt2_tokenizer.sh, which scripts/setup.sh runs
// before any test; they are looked for in $TRIDENT_TOKENIZER_DIR, else <repo>/data/gpt2.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "data/gpt2_tokenizer.h"
#include "data/pretokenize.h"
#include "io/utf8.h"
#include "kernels/error.h"

namespace fs = std::filesystem;
using namespace trident;
using data::Gpt2Tokenizer;

namespace {

std::string tokenizer_dir() {
    const char* env = std::getenv("TRIDENT_TOKENIZER_DIR");
    return env && *env ? env : TRIDENT_SOURCE_DIR "/data/gpt2";
}

const Gpt2Tokenizer& gpt2() {
    const std::string dir = tokenizer_dir();
    INFO("GPT-2 tokenizer files in " << dir << " (scripts/fetch_gpt2_tokenizer.sh fetches them)");
    REQUIRE(fs::exists(fs::path(dir) / "encoder.json"));
    REQUIRE(fs::exists(fs::path(dir) / "vocab.bpe"));
    static const Gpt2Tokenizer tokenizer(dir);
    return tokenizer;
}

std::vector<int32_t> encode(const Gpt2Tokenizer& t, std::string_view text) {
    std::vector<int32_t> ids;
    t.encode(text, ids);
    return ids;
}

// Text for messages: printable ASCII as is, everything else as \xNN.
std::string escaped(std::string_view text) {
    std::string out;
    for (const char ch : text) {
        const auto c = static_cast<unsigned char>(ch);
        if (c >= 0x20 && c < 0x7F && c != '\\') {
            out += ch;
        } else {
            char hex[8];
            std::snprintf(hex, sizeof hex, "\\x%02x", c);
            out += hex;
        }
    }
    return out;
}

// decode(encode(text)) == text, failing with the first differing byte and its context.
void check_round_trip(const Gpt2Tokenizer& t, const std::string& text) {
    const std::vector<int32_t> ids = encode(t, text);
    const std::string back = t.decode(ids);
    if (back == text) return;
    std::size_t at = 0;
    while (at < back.size() && at < text.size() && back[at] == text[at]) ++at;
    const std::size_t from = at < 16 ? 0 : at - 16;
    FAIL("round trip of " << text.size() << " bytes differs at byte " << at << ": input ..."
                          << escaped(std::string_view(text).substr(from, 32)) << "... decoded ..."
                          << escaped(std::string_view(back).substr(from, 32)) << "...");
}

// Pieces for messages: [piece][piece]...
std::string bracketed(const std::vector<std::string>& pieces) {
    std::string out;
    for (const auto& p : pieces) out.append("[").append(escaped(p)).append("]");
    return out;
}

std::string ids_text(const std::vector<int32_t>& ids) {
    std::ostringstream s;
    for (std::size_t i = 0; i < ids.size(); ++i) s << (i ? "," : "") << ids[i];
    return s.str();
}

// Random valid UTF-8 mixing what the pre-tokenizer tells apart: ASCII words, digits,
// punctuation and apostrophes, runs of spaces, tabs and newlines, Unicode whitespace,
// accented and non-Latin letters, combining marks, emoji (4-byte), and any code point at all.
std::string random_utf8(std::mt19937& rng) {
    static const char32_t kPalette[] = {U'é',   U'ß',    U'Ж',    U'中',   U'ع',    U'क',    0x094D,
                                        0x0301, 0x200D,  0x00A0,  0x0085,  0xFEFF,  0x2028,  0x3000,
                                        0x1680, 0x1F600, 0x1F44D, 0x1F3FD, 0x10348, 0x1D7D8, U'½',
                                        U'Ⅻ',   U'٣',    U'’',    U'“',    U'—',    U'€'};
    std::string out;
    const int parts = std::uniform_int_distribution<int>(0, 24)(rng);
    for (int p = 0; p < parts; ++p) {
        const int kind = std::uniform_int_distribution<int>(0, 7)(rng);
        const int n = std::uniform_int_distribution<int>(1, 6)(rng);
        for (int i = 0; i < n; ++i) {
            switch (kind) {
                case 0:
                    out += static_cast<char>('a' + rng() % 26);
                    break;
                case 1:
                    out += static_cast<char>('0' + rng() % 10);
                    break;
                case 2:
                    out += "'!.,;-\"()?<|>"[rng() % 13];
                    break;
                case 3:
                    out += " \t\n\r\v\f"[rng() % 6];
                    break;
                case 4:
                    out += ' ';
                    break;
                case 5:
                    trident::io::append_utf8(out, kPalette[rng() % std::size(kPalette)]);
                    break;
                case 6: {  // any scalar value: no surrogates
                    char32_t c = std::uniform_int_distribution<char32_t>(0, 0x10FFFF)(rng);
                    if (c >= 0xD800 && c <= 0xDFFF) c -= 0x800;
                    trident::io::append_utf8(out, c);
                    break;
                }
                default:
                    out += "'s"[i % 2];
                    break;
            }
        }
    }
    return out;
}

struct TempDir {
    fs::path dir = fs::temp_directory_path() / ("trident_tokenizer_" + std::to_string(::getpid()));
    TempDir() { fs::create_directories(dir); }
    ~TempDir() { fs::remove_all(dir); }
};

std::string read_file(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

void write_file(const fs::path& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
}

}  // namespace

TEST_CASE("tokenizer: ids match the JavaScript encoder's on known strings", "[tokenizer]") {
    const Gpt2Tokenizer& t = gpt2();
    CHECK(t.vocab_size() == 50257);
    // Each pair's ids were produced by gpt-3-encoder's Encoder.js.
    const std::vector<std::pair<std::string, std::vector<int32_t>>> known = {
        {"Hello world", {15496, 995}},
        {" the", {262}},
        {"don't", {9099, 470}},
        {"I'M here", {40, 6, 44, 994}},
        {"He's   gone  ", {1544, 338, 220, 220, 3750, 220, 220}},
        {"a\n\n\nb", {64, 628, 198, 65}},
        {"12345 1,000.5", {10163, 2231, 352, 11, 830, 13, 20}},
        {"naïve café", {2616, 38776, 40304}},
        {"😀👍🏽", {47249, 222, 41840, 235, 8582, 237, 121}},
        {"\u00a0x", {1849, 87}},
        {" \ufeffx", {220, 171, 119, 123, 87}},
        {"'s'S'll'LL", {338, 6, 50, 1183, 6, 3069}},
        {"<|endoftext|>", {27, 91, 437, 1659, 5239, 91, 29}},
        {"", {}},
    };
    for (const auto& [text, ids] : known) {
        INFO("encode(\"" << escaped(text) << "\")");
        CHECK(ids_text(encode(t, text)) == ids_text(ids));
        CHECK(t.decode(ids) == text);
    }
    CHECK(t.decode(std::vector<int32_t>{Gpt2Tokenizer::kEndOfText}) == "<|endoftext|>");
}

TEST_CASE("tokenizer: pieces follow GPT-2's regular expression", "[tokenizer]") {
    // Worked out by hand from 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|
    // \s+(?!\S)|\s+ with JavaScript's \s.
    const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
        {"Hello  world", {"Hello", " ", " world"}},
        {"x   ", {"x", "   "}},
        {"a\n\n\nb", {"a", "\n\n", "\n", "b"}},
        {"a \tb", {"a", " ", "\t", "b"}},
        {"they're 'sam'S'LL", {"they", "'re", " '", "sam", "'", "S", "'", "LL"}},
        {"''s", {"''", "s"}},
        {"abc123def 45", {"abc", "123", "def", " 45"}},
        {" ...!?x", {" ...!?", "x"}},
        {"e\u0301t\u00e9", {"e", "\u0301", "t\u00e9"}},  // a combining mark is no letter
        {"a\u00a0b", {"a", "\u00a0", "b"}},              // NBSP is \s, but only U+0020 leads
        {"a \u00a0b", {"a", " ", "\u00a0", "b"}},
        {"a\ufeff\ufeffb", {"a", "\ufeff", "\ufeff", "b"}},  // U+FEFF is \s in JavaScript
        {"a\u0085b", {"a", "\u0085", "b"}},                  // U+0085 is not: "other"
        {"x\u2028\u2029", {"x", "\u2028\u2029"}},
        {"\xff\xfe ab\xc3", {"\xff\xfe", " ab", "\xc3"}},  // invalid bytes are "other"
    };
    for (const auto& [text, pieces] : cases) {
        INFO("pretokenize(\"" << escaped(text) << "\")");
        const auto got = data::pretokenize(text);
        std::vector<std::string> got_strings(got.begin(), got.end());
        CHECK(bracketed(got_strings) == bracketed(pieces));
    }
}

TEST_CASE("tokenizer: random UTF-8 round-trips exactly", "[tokenizer]") {
    const Gpt2Tokenizer& t = gpt2();
    std::mt19937 rng(1234);
    for (int i = 0; i < 3000; ++i) {
        const std::string text = random_utf8(rng);
        std::string joined;
        for (const auto piece : data::pretokenize(text)) {
            REQUIRE(!piece.empty());
            joined += piece;
        }
        REQUIRE(joined == text);
        check_round_trip(t, text);
    }
    // A piece far longer than any word: merged in O(n log n), not quadratic time.
    check_round_trip(t, std::string(200000, 'a'));
    check_round_trip(t, std::string(100000, '!') + std::string(50000, ' '));
}

TEST_CASE("tokenizer: invalid UTF-8 round-trips byte for byte", "[tokenizer]") {
    const Gpt2Tokenizer& t = gpt2();
    // Truncated, overlong, a surrogate, above U+10FFFF, lone continuation and lead bytes.
    for (const std::string text : {"\xc3", "a\xe4\xb8", "\xc0\xaf", "\xed\xa0\x80x",
                                   "\xf4\x90\x80\x80", "\x80\x80 \xbf", " \xff\xfe\xfd", "\xf8"})
        check_round_trip(t, text);
    std::mt19937 rng(99);
    for (int i = 0; i < 2000; ++i) {
        std::string text(rng() % 64, '\0');
        for (char& c : text) c = static_cast<char>(rng() % 256);
        check_round_trip(t, text);
    }
}

TEST_CASE("tokenizer: concurrent encoding gives the single-threaded ids", "[tokenizer]") {
    const Gpt2Tokenizer& t = gpt2();
    std::mt19937 rng(7);
    std::string text;
    for (int i = 0; i < 400; ++i) text += random_utf8(rng) + " the quick brown fox\n";
    const std::vector<int32_t> expected = encode(t, text);
    std::vector<std::vector<int32_t>> got(4);
    std::vector<std::thread> threads;
    for (auto& ids : got)
        threads.emplace_back([&t, &text, &ids] {
            for (int r = 0; r < 3; ++r) {
                ids.clear();
                t.encode(text, ids);
            }
        });
    for (auto& th : threads) th.join();
    for (const auto& ids : got) CHECK(ids == expected);
}

TEST_CASE("tokenizer: two tokenizers in one thread do not share cached ids", "[tokenizer]") {
    const Gpt2Tokenizer& full = gpt2();
    TempDir tmp;
    // The same vocabulary with only the first 300 merges: fewer merges, other ids.
    fs::copy_file(fs::path(tokenizer_dir()) / "encoder.json", tmp.dir / "encoder.json");
    std::istringstream merges(read_file(fs::path(tokenizer_dir()) / "vocab.bpe"));
    std::string line, head;
    for (int i = 0; i < 301 && std::getline(merges, line); ++i) head += line + "\n";
    write_file(tmp.dir / "vocab.bpe", head);
    const Gpt2Tokenizer small(tmp.dir.string());
    const std::string text = "Hello world, hello world";
    const auto full_ids = encode(full, text);
    const auto small_ids = encode(small, text);
    CHECK(full_ids != small_ids);
    CHECK(small.decode(small_ids) == text);
    CHECK(encode(full, text) == full_ids);
    CHECK(encode(small, text) == small_ids);
}

TEST_CASE("tokenizer: ids outside the vocabulary are errors", "[tokenizer][bad-input]") {
    const Gpt2Tokenizer& t = gpt2();
    CHECK_THROWS_WITH(t.decode(std::vector<int32_t>{15496, 50257}),
                      Catch::Contains("50257") && Catch::Contains("outside"));
    CHECK_THROWS_AS(t.decode(std::vector<int32_t>{-1}), Error);
}

TEST_CASE("tokenizer: missing or corrupt files are errors naming the file",
          "[tokenizer][bad-input]") {
    const std::string encoder = read_file(fs::path(tokenizer_dir()) / "encoder.json");
    const std::string merges = read_file(fs::path(tokenizer_dir()) / "vocab.bpe");
    REQUIRE(!encoder.empty());
    TempDir tmp;
    const auto make = [&](const std::string& enc, const std::string& bpe) {
        fs::remove(tmp.dir / "encoder.json");
        fs::remove(tmp.dir / "vocab.bpe");
        if (!enc.empty()) write_file(tmp.dir / "encoder.json", enc);
        if (!bpe.empty()) write_file(tmp.dir / "vocab.bpe", bpe);
        return tmp.dir.string();
    };
    using Catch::Contains;
    CHECK_THROWS_WITH(Gpt2Tokenizer(make("", merges)),
                      Contains("encoder.json: cannot open") && Contains("fetch_gpt2_tokenizer"));
    CHECK_THROWS_WITH(Gpt2Tokenizer(make(encoder, "")), Contains("vocab.bpe: cannot open"));
    CHECK_THROWS_WITH(Gpt2Tokenizer(make(encoder.substr(0, encoder.size() / 2), merges)),
                      Contains("encoder.json: byte"));
    CHECK_THROWS_WITH(Gpt2Tokenizer(make("[1, 2]", merges)), Contains("encoder.json: expected"));
    std::string bad_id = encoder;
    bad_id.replace(bad_id.find("\"!\": 0"), 6, "\"!\": -5");
    CHECK_THROWS_WITH(Gpt2Tokenizer(make(bad_id, merges)),
                      Contains("encoder.json: token \"!\": expected an id"));
    std::string bad_char = encoder;
    bad_char.replace(bad_char.find("\"!\": 0"), 6, "\"\\u0400\": 0");
    CHECK_THROWS_WITH(Gpt2Tokenizer(make(bad_char, merges)),
                      Contains("encoder.json: token") && Contains("stands for no byte"));

    const std::size_t line2 = merges.find('\n') + 1;
    CHECK_THROWS_WITH(Gpt2Tokenizer(make(encoder, merges.substr(line2))),
                      Contains("vocab.bpe: line 1: expected the \"#version\" header"));
    CHECK_THROWS_WITH(Gpt2Tokenizer(make(encoder, merges.substr(0, line2) + "Ġt\n")),
                      Contains("vocab.bpe: line 2: expected two tokens"));
    CHECK_THROWS_WITH(Gpt2Tokenizer(make(encoder, merges.substr(0, line2) + "Ġ the\n")),
                      Contains("vocab.bpe: line 2: uses a token that no earlier merge makes"));
    CHECK_THROWS_WITH(Gpt2Tokenizer(make(encoder, merges.substr(0, line2) + "Ġ t\nĠ t\n")),
                      Contains("vocab.bpe: line 3: makes a token that is already made"));
    CHECK_THROWS_WITH(Gpt2Tokenizer(make(encoder, merges.substr(0, line2) + "Ġ Ж\n")),
                      Contains("vocab.bpe: line 2:") && Contains("stands for no byte"));
    CHECK_THROWS_WITH(Gpt2Tokenizer(make(encoder, merges.substr(0, line2))),
                      Contains("vocab.bpe: no merges"));
}

TEST_CASE("tokenizer: the default directory honours TRIDENT_TOKENIZER_DIR", "[tokenizer]") {
    const char* old = std::getenv("TRIDENT_TOKENIZER_DIR");
    const std::string saved = old ? old : "";
    ::setenv("TRIDENT_TOKENIZER_DIR", "/some/where", 1);
    CHECK(data::default_tokenizer_dir() == "/some/where");
    ::unsetenv("TRIDENT_TOKENIZER_DIR");
    // The test binary is build/tests/trident_tests: build/data/gpt2 does not exist.
    CHECK(data::default_tokenizer_dir() == "data/gpt2");
    if (old) ::setenv("TRIDENT_TOKENIZER_DIR", saved.c_str(), 1);
}
