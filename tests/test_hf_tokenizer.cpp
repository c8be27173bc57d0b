// Hugging Face tokenizer.json files (data/hf_tokenizer.h) on a small file written by hand
// (tests/small_tokenizer_json.h): ids worked out by hand (merges, ignore_merges, added tokens,
// the post-processor's tokens, the end of text), and every unsupported or broken part refused
// with one error naming the file and the key. The comparison with the tokenizers library
// itself is tests/python/test_tokenizer_json.py; random mutations are tests/test_fuzz.cpp's.
#include <catch2/catch.hpp>
#include <fstream>
#include <string>
#include <vector>

#include "data/hf_tokenizer.h"
#include "data/tokenizer.h"
#include "kernels/error.h"
#include "small_tokenizer_json.h"
#include "temp_dir.h"

using namespace trident;
using Catch::Contains;

namespace {

std::string write(const TempDir& dir, const std::string& text) {
    const std::string path = dir / "tokenizer.json";
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
    return path;
}

std::vector<int32_t> ids(const data::Tokenizer& t, std::string_view text) {
    std::vector<int32_t> out;
    t.encode(text, out);
    return out;
}

// The small file with `from` replaced by `to` (which must be there).
std::string edited(const std::string& from, const std::string& to) {
    std::string text = small_tokenizer::json();
    const std::size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    return text.replace(at, from.size(), to);
}

}  // namespace

TEST_CASE("tokenizer.json: a small file encodes as worked out by hand", "[tokenizer]") {
    TempDir dir("hf_tokenizer");
    const auto t = data::make_tokenizer(write(dir, small_tokenizer::json()));
    CHECK(t->vocab_size() == 262);
    CHECK(ids(*t, "abab") == std::vector<int32_t>{258});      // a+b twice, then ab+ab
    CHECK(ids(*t, "aba") == std::vector<int32_t>{256, 'a'});  // the leftmost a+b first
    CHECK(ids(*t, "x a") == std::vector<int32_t>{'x', 257});  // GPT-2's pieces "x", " a"
    CHECK(ids(*t, "xyz") == std::vector<int32_t>{259});       // ignore_merges
    CHECK(ids(*t, "x<s>y<|endoftext|>") == std::vector<int32_t>{'x', 261, 'y', 260});
    CHECK(ids(*t, "<s<s>>") == std::vector<int32_t>{'<', 's', 261, '>'});
    CHECK(t->decode(std::vector<int32_t>{261, 258, 259, 260}) == "<s>ababxyz<|endoftext|>");
    CHECK_THROWS_WITH(t->decode(std::vector<int32_t>{262}), Contains("262"));
    CHECK(t->end_of_text() == 260);
    CHECK(std::vector<int32_t>(t->document_start().begin(), t->document_start().end()) ==
          std::vector<int32_t>{261});
    CHECK(t->document_end().empty());

    const auto merged = data::make_tokenizer(
        write(dir, edited("\"ignore_merges\": true", "\"ignore_merges\": false")));
    CHECK(ids(*merged, "xyz") == std::vector<int32_t>{'x', 'y', 'z'});
}

TEST_CASE("tokenizer.json: a cut never splits an added token", "[tokenizer]") {
    TempDir dir("hf_tokenizer_cut");
    const auto t = data::make_tokenizer(
        write(dir, edited("\"<s>\", \"single_word\"", "\"a\\nb\", \"single_word\"")));
    CHECK(t->can_cut("xx\nyy", 3));
    CHECK_FALSE(t->can_cut("xa\nby", 3));  // inside "a\nb"
    CHECK_FALSE(t->can_cut("x \nyy", 3));  // a space before the newline
}

TEST_CASE("tokenizer.json: unsupported or broken files are one error naming the key",
          "[tokenizer][bad-input]") {
    TempDir dir("hf_tokenizer_bad");
    const auto refused = [&](const std::string& text) {
        const std::string path = write(dir, text);
        try {
            data::make_tokenizer(path);
        } catch (const Error& e) {
            const std::string message = e.what();
            CHECK_THAT(message, Contains(path));
            return message;
        }
        FAIL("accepted");
        return std::string();
    };
    const std::string json = small_tokenizer::json();
    CHECK_THAT(refused(json.substr(0, json.size() / 2)), Contains("byte"));
    CHECK_THAT(refused("[]"), Contains("expected a JSON object"));
    CHECK_THAT(refused(edited("\"model\":", "\"modal\":")), Contains("\"model\""));
    CHECK_THAT(refused(edited("\"type\": \"BPE\"", "\"type\": \"WordPiece\"")),
               Contains("model.type") && Contains("WordPiece"));
    CHECK_THAT(refused(edited("\"dropout\": null", "\"dropout\": 0.1")), Contains("model.dropout"));
    CHECK_THAT(refused(edited("\"byte_fallback\": false", "\"byte_fallback\": true")),
               Contains("model.byte_fallback"));
    CHECK_THAT(refused(edited("\"xyz\": 259", "\"xyz\": 300")), Contains("model.vocab.\"xyz\""));
    CHECK_THAT(refused(edited("\"xyz\": 259", "\"xyz\": 258")), Contains("used twice"));
    CHECK_THAT(refused(edited("\"ab ab\"", "\"ab xyzw\"")),
               Contains("model.merges[2]") && Contains("not in the vocabulary"));
    CHECK_THAT(refused(edited("\"ab ab\"", "\"abab\"")), Contains("model.merges[2]"));
    CHECK_THAT(refused(edited("\"ab ab\"", "\"a b\"")),
               Contains("model.merges[2]: this merge is listed twice"));
    CHECK_THAT(refused(edited("\"a\": 97", "\"\\u0400\": 97")), Contains("stands for no byte"));
    CHECK_THAT(refused(edited("\"add_prefix_space\": false", "\"add_prefix_space\": true")),
               Contains("pre_tokenizer.add_prefix_space"));
    CHECK_THAT(refused(edited("\"use_regex\": true}", "\"use_regex\": false}")),
               Contains("pre_tokenizer.use_regex"));
    CHECK_THAT(refused(edited("{\"type\": \"ByteLevel\", \"add_prefix_space\": false",
                              "{\"type\": \"Whitespace\", \"add_prefix_space\": false")),
               Contains("pre_tokenizer") && Contains("Whitespace"));
    // Llama 3's form: a Split on an expression, then ByteLevel without its own.
    const auto sequence = [](const std::string& regex, const std::string& behavior,
                             const std::string& invert) {
        return R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": ")" +
               regex + R"("}, "behavior": ")" + behavior + R"(", "invert": )" + invert +
               R"(}, {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]})";
    };
    const std::string llama3 =
        R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+)";
    TempDir ok("hf_tokenizer_llama");
    CHECK_NOTHROW(data::make_tokenizer(
        write(ok, edited(small_tokenizer::kByteLevel, sequence(llama3, "Isolated", "false")))));
    CHECK_THAT(
        refused(edited(small_tokenizer::kByteLevel, sequence(R"(\\s+|\\w+)", "Isolated", "false"))),
        Contains("pre_tokenizer.pretokenizers[0].pattern") && Contains(R"(\\s+|\\w+)") &&
            Contains("(?i:'s|'t|'re|'ve|'m|'ll|'d)"));
    CHECK_THAT(refused(edited(small_tokenizer::kByteLevel, sequence(llama3, "Removed", "false"))),
               Contains("pretokenizers[0].behavior") && Contains("Removed"));
    CHECK_THAT(refused(edited(small_tokenizer::kByteLevel, sequence(llama3, "Isolated", "true"))),
               Contains("pretokenizers[0].invert"));
    CHECK_THAT(refused(edited("\"normalizer\": null", "\"normalizer\": {\"type\": \"NFC\"}")),
               Contains("normalizer: only null"));
    CHECK_THAT(refused(edited("\"padding\": null", "\"padding\": {}")), Contains("padding"));
    CHECK_THAT(refused(edited("\"lstrip\": false", "\"lstrip\": true")),
               Contains("added_tokens[0].lstrip"));
    CHECK_THAT(refused(edited("\"id\": 261", "\"id\": 265")), Contains("added_tokens[1].id"));
    CHECK_THAT(refused(edited("\"ids\": [261]", "\"ids\": [999]")),
               Contains("post_processor") && Contains("999"));
    CHECK_THAT(refused(edited("{\"SpecialToken\": {\"id\": \"<s>\"",
                              "{\"SpecialToken\": {\"id\": \"<t>\"")),
               Contains("special_tokens"));
    CHECK_THAT(refused(edited("\"type\": \"TemplateProcessing\"", "\"type\": \"BertProcessing\"")),
               Contains("post_processor.type") && Contains("BertProcessing"));
    CHECK_THAT(refused(edited("\"decoder\": {\"type\": \"ByteLevel\"",
                              "\"decoder\": {\"type\": \"WordPiece\"")),
               Contains("decoder.type"));
    CHECK_THAT(refused(edited("\"\\u0120\", \"a\"]", "\"\\u0120\"]")), Contains("model.merges[1]"));
    // A byte with no token: the vocabulary lacks "z" (122), renamed to a token of two bytes.
    CHECK_THAT(refused(edited("\"z\": 122", "\"zz\": 122")),
               Contains("model.vocab") && Contains("single byte 122"));
}
