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
// The matcher is written by hand over code points. Letters (\p{L}) and numbers (\p{N}) are
// Unicode general categories, from ICU. Whitespace is JavaScript's \s (ECMA-262, WhiteSpace and
// LineTerminator): TAB, LF, VT, FF, CR, SPACE, U+00A0, U+FEFF, every Zs, U+2028 and U+2029 —
// so U+FEFF is whitespace and U+0085 is not, unlike Python's `regex` module.
//
// Invalid UTF-8 (a JS string cannot hold it): each byte that does not start a valid sequence
// (bad lead or continuation, overlong form, surrogate, beyond U+10FFFF, truncated) counts as
// one character of its own that is neither whitespace, letter nor number, so it joins a run of
// punctuation. Pieces are byte ranges of the input, so such bytes round-trip exactly.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace trident::data {

// The end (a byte offset) of the piece that starts at byte `start` of `text`;
// requires start < text.size().
std::size_t pretoken_end(std::string_view text, std::size_t start);

// All pieces of `text` in order; they concatenate to `text`.
std::vector<std::string_view> pretokenize(std::string_view text);

// The length (1 to 4) of the valid UTF-8 sequence at byte `pos` of `text`, with its code point
// in `code`; 0 when the bytes there are not one (the rules above).
int utf8_sequence(std::string_view text, std::size_t pos, char32_t& code);

}  // namespace trident::data
