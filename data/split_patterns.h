// The pre-tokenizer regular expressions of Hugging Face tokenizer.json files that Trident runs
// (a Split pre-tokenizer's "Regex", or ByteLevel's own with use_regex), each recognised by its
// exact text and matched by a scan written by hand: C++ has no regular expressions with
// \p{L}. Whitespace is Unicode's White_Space, as the tokenizers library's Oniguruma has it
// (data/unicode_class.h).
//
//   gpt2    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//           (GPT-2; ByteLevel's built-in expression; data/pretokenize.h)
//   llama3  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+   (Llama 3, one line)
//   qwen2   the same with \p{N} for \p{N}{1,3}: digits one by one (Qwen2)
//
// Every character is matched by one of the alternatives, so the matches tile the text:
// Split's "Isolated" behaviour gives exactly these pieces.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace trident::data {

enum class SplitPattern { gpt2, llama3, qwen2 };

// The pattern whose regular expression is `regex` (character for character), if any.
std::optional<SplitPattern> recognise_pattern(std::string_view regex);

// The texts of the patterns, for messages.
std::string known_patterns();

// The end (a byte offset) of the piece that starts at byte `start` of `text`
// (start < text.size()).
std::size_t split_end(SplitPattern pattern, std::string_view text, std::size_t start);

}  // namespace trident::data
