// GPT-2's pre-tokenizer of data/pretokenize.h: the regular expression's alternatives, tried in
// its order, written out as a scan over classified code points.
#include "data/pretokenize.h"

#include <unicode/uchar.h>

#include <array>
#include <cstdint>

namespace trident::data {

namespace {

// What the regular expression distinguishes about a character.
enum class CharClass : uint8_t { letter, number, space, other };

struct Char {
    CharClass cls;
    uint8_t bytes;  // its length in the text
};

// ASCII, which is nearly all of English text, is classified by table.
constexpr std::array<CharClass, 128> kAsciiClass = [] {
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

CharClass classify(char32_t code) {
    const auto c = static_cast<UChar32>(code);
    const uint32_t mask = U_GET_GC_MASK(c);
    if (mask & U_GC_L_MASK) return CharClass::letter;
    if (mask & U_GC_N_MASK) return CharClass::number;
    // JavaScript's \s beyond ASCII: the Zs category (U+00A0, U+1680, U+2000-U+200A, U+202F,
    // U+205F, U+3000), the line and paragraph separators U+2028 (Zl) and U+2029 (Zp), and
    // U+FEFF, which ECMA-262 lists as WhiteSpace although it is a format character (Cf).
    if ((mask & U_GC_Z_MASK) || code == 0xFEFF) return CharClass::space;
    return CharClass::other;
}

Char char_at(std::string_view text, std::size_t pos) {
    const auto lead = static_cast<unsigned char>(text[pos]);
    if (lead < 0x80) return {kAsciiClass[lead], 1};
    char32_t code = 0;
    const int bytes = utf8_sequence(text, pos, code);
    if (bytes == 0) return {CharClass::other, 1};  // an invalid byte: punctuation-like
    return {classify(code), static_cast<uint8_t>(bytes)};
}

// The end of the run of characters of class `cls` that starts at `pos`.
std::size_t run_end(std::string_view text, std::size_t pos, CharClass cls) {
    while (pos < text.size()) {
        const Char c = char_at(text, pos);
        if (c.cls != cls) break;
        pos += c.bytes;
    }
    return pos;
}

// 's 't 're 've 'm 'll 'd, lower case only: their length, or 0.
std::size_t contraction_length(std::string_view text, std::size_t start) {
    const std::string_view rest = text.substr(start + 1, 2);
    if (rest.empty()) return 0;
    const char a = rest[0];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (rest.size() == 2 && (rest == "re" || rest == "ve" || rest == "ll")) return 3;
    return 0;
}

}  // namespace

int utf8_sequence(std::string_view text, std::size_t pos, char32_t& code) {
    const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
    const unsigned lead = byte(pos);
    int extra = 0;
    char32_t min = 0;
    if (lead < 0x80) {
        code = lead;
        return 1;
    } else if ((lead & 0xE0) == 0xC0) {
        extra = 1, code = lead & 0x1F, min = 0x80;
    } else if ((lead & 0xF0) == 0xE0) {
        extra = 2, code = lead & 0x0F, min = 0x800;
    } else if ((lead & 0xF8) == 0xF0) {
        extra = 3, code = lead & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (pos + static_cast<std::size_t>(extra) >= text.size()) return 0;
    for (int i = 1; i <= extra; ++i) {
        const unsigned b = byte(pos + static_cast<std::size_t>(i));
        if ((b & 0xC0) != 0x80) return 0;
        code = (code << 6) | (b & 0x3F);
    }
    if (code < min || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return 0;
    return extra + 1;
}

std::size_t pretoken_end(std::string_view text, std::size_t start) {
    // 's|'t|'re|'ve|'m|'ll|'d
    if (text[start] == '\'') {
        const std::size_t n = contraction_length(text, start);
        if (n) return start + n;
    }
    // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': whatever follows a space that is not
    // whitespace is a letter, a number or "other", so one of the three takes the space.
    const Char first = char_at(text, start);
    if (first.cls != CharClass::space) return run_end(text, start, first.cls);
    if (text[start] == ' ' && start + 1 < text.size()) {
        const Char next = char_at(text, start + 1);
        if (next.cls != CharClass::space) return run_end(text, start + 1, next.cls);
    }
    // '\s+(?!\S)': the whole whitespace run at the end of the text, else the run less its last
    // character (which then leads the next piece); '\s+' when that leaves nothing.
    std::size_t pos = start, last = start;
    while (pos < text.size()) {
        const Char c = char_at(text, pos);
        if (c.cls != CharClass::space) break;
        last = pos;
        pos += c.bytes;
    }
    if (pos == text.size() || last == start) return pos;
    return last;
}

std::vector<std::string_view> pretokenize(std::string_view text) {
    std::vector<std::string_view> pieces;
    for (std::size_t pos = 0; pos < text.size();) {
        const std::size_t end = pretoken_end(text, pos);
        pieces.push_back(text.substr(pos, end - pos));
        pos = end;
    }
    return pieces;
}

}  // namespace trident::data
