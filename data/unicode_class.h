// What the pre-tokenizers' regular expressions tell apart about a character (letter \p{L},
// number \p{N}, whitespace \s, anything else), read from UTF-8 one code point at a time.
//
// Letters and numbers are Unicode general categories, from ICU. Whitespace depends on the
// regular-expression engine whose results are matched:
//   javascript: JavaScript's \s (ECMA-262 WhiteSpace and LineTerminator) — TAB, LF, VT, FF,
//               CR, every Zs, U+2028, U+2029 and U+FEFF; not U+0085. The npm package
//               gpt-3-encoder, which data/gpt2_tokenizer.h is checked against, runs in it.
//   unicode:    Unicode's White_Space property — the same less U+FEFF, plus U+0085. The
//               tokenizers library's regular expressions (Oniguruma) use it for \s.
//
// Invalid UTF-8: each byte that does not start a valid sequence (bad lead or continuation,
// overlong form, surrogate, beyond U+10FFFF, truncated) is one character of its own that is
// neither whitespace, letter nor number.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace trident::data {

enum class CharClass : uint8_t { letter, number, space, other };
enum class SpaceRule : uint8_t { javascript, unicode };

struct Char {
    CharClass cls;
    uint8_t bytes;  // its length in the text
};

// The length (1 to 4) of the valid UTF-8 sequence at byte `pos` of `text`, with its code point
// in `code`; 0 when the bytes there are not one (the rules above).
int utf8_sequence(std::string_view text, std::size_t pos, char32_t& code);

// The class of a code point at or above 0x80.
CharClass classify_non_ascii(char32_t code, SpaceRule rule);

// ASCII, which is nearly all of English text, is classified by table; both rules agree on it.
inline constexpr std::array<CharClass, 128> kAsciiClass = [] {
    std::array<CharClass, 128> t{};
    for (int c = 0; c < 128; ++c) {
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
            t[c] = CharClass::letter;
        else if (c >= '0' && c <= '9')
            t[c] = CharClass::number;
        else if (c == ' ' || (c >= '\t' && c <= '\r'))  // TAB LF VT FF CR
            t[c] = CharClass::space;
        else
            t[c] = CharClass::other;
    }
    return t;
}();

// The character at byte `pos` of `text` (pos < text.size()).
inline Char char_at(std::string_view text, std::size_t pos, SpaceRule rule) {
    const auto lead = static_cast<unsigned char>(text[pos]);
    if (lead < 0x80) return {kAsciiClass[lead], 1};
    char32_t code = 0;
    const int bytes = utf8_sequence(text, pos, code);
    if (bytes == 0) return {CharClass::other, 1};  // an invalid byte: punctuation-like
    return {classify_non_ascii(code, rule), static_cast<uint8_t>(bytes)};
}

}  // namespace trident::data
