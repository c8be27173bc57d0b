// A small tokenizer.json written out by hand, for the tests of data/hf_tokenizer.h
// (tests/test_hf_tokenizer.cpp) and its fuzz test (tests/test_fuzz.cpp).
//
// Vocabulary: the 256 bytes (id = byte), 256 "ab", 257 " a", 258 "abab", 259 "xyz" (no merge
// makes it: only ignore_merges does); merges a+b, " "+a, ab+ab. Added: 260 <|endoftext|>,
// 261 <s> (both special); the post-processor puts <s> first. Pre-tokenizer: ByteLevel with
// GPT-2's expression.
#pragma once

#include <string>

namespace small_tokenizer {

// GPT-2's byte-to-unicode mapping, written independently of data/byte_level.cpp: byte b's
// token string, UTF-8.
inline std::string byte_string(int b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    int code = b;
    if (!printable) {
        code = 256;
        for (int c = 0; c < b; ++c)
            if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE)) ++code;
    }
    std::string s;
    if (code < 0x80) {
        s += static_cast<char>(code);
    } else {
        s += static_cast<char>(0xC0 | (code >> 6));
        s += static_cast<char>(0x80 | (code & 0x3F));
    }
    return s;
}

// A JSON string literal of a byte-level token string (only '"' and '\\' need escaping).
inline std::string quoted(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') out += '\\';
        out += c;
    }
    return out + "\"";
}

// The pre-tokenizer, for tests that replace it.
inline constexpr const char* kByteLevel =
    R"({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})";

inline std::string json() {
    std::string vocab;
    for (int b = 0; b < 256; ++b) vocab += quoted(byte_string(b)) + ": " + std::to_string(b) + ", ";
    vocab +=
        "\"ab\": 256, \"\xC4\xA0"
        "a\": 257, \"abab\": 258, \"xyz\": 259";
    return R"({"version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [
    {"id": 260, "content": "<|endoftext|>", "single_word": false, "lstrip": false,
     "rstrip": false, "normalized": false, "special": true},
    {"id": 261, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false,
     "normalized": false, "special": true}],
  "normalizer": null,
  "pre_tokenizer": )" +
           std::string(kByteLevel) + R"(,
  "post_processor": {"type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
    "pair": [],
    "special_tokens": {"<s>": {"id": "<s>", "ids": [261], "tokens": ["<s>"]}}},
  "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
  "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": true,
            "vocab": {)" +
           vocab + R"(},
            "merges": ["a b", ["\u0120", "a"], "ab ab"]}}
)";
}

}  // namespace small_tokenizer
