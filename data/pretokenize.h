// GPT-2's pre-tokenizer: splits text into the pieces that byte-level BPE then encodes one at a
// time (a BPE merge never crosses two pieces).
//
// It behaves exactly like GPT-2's regular expression (openai/gpt-2, src/encoder.py)
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// as JavaScript runs it with the u flag, because the independent encoder the tests compare
// with (the npm package gpt-3-encoder, Encoder.js) does. In words: an English contraction; else
// a run of letters, of numbers, or of other characters, each taking one leading space (U+0020
// only) with it; else a run of whitespace, less its last character when a non-space follows
// (that character then leads the next piece).
//
// The matcher is written by hand over code points, with the character classes of
// data/unicode_class.h. Whitespace is JavaScript's \s by default, because the independent
// encoder the tests compare with (the npm package gpt-3-encoder, Encoder.js) runs in
// JavaScript; SpaceRule::unicode gives the same expression as the tokenizers library runs it
// (a tokenizer.json's ByteLevel pre-tokenizer, data/hf_tokenizer.h).
//
// Invalid UTF-8 (a JS string cannot hold it) joins a run of punctuation (unicode_class.h).
// Pieces are byte ranges of the input, so such bytes round-trip exactly.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

#include "data/unicode_class.h"

namespace trident::data {

// The end (a byte offset) of the piece that starts at byte `start` of `text`;
// requires start < text.size().
std::size_t pretoken_end(std::string_view text, std::size_t start,
                         SpaceRule rule = SpaceRule::javascript);

// All pieces of `text` in order; they concatenate to `text`.
std::vector<std::string_view> pretokenize(std::string_view text);

}  // namespace trident::data
