// The character classes of data/unicode_class.h: UTF-8 decoding and ICU's categories.
#include "data/unicode_class.h"

#include <unicode/uchar.h>

namespace trident::data {

CharClass classify_non_ascii(char32_t code, SpaceRule rule) {
    const auto c = static_cast<UChar32>(code);
    const uint32_t mask = U_GET_GC_MASK(c);
    if (mask & U_GC_L_MASK) return CharClass::letter;
    if (mask & U_GC_N_MASK) return CharClass::number;
    // Beyond ASCII both rules take the Zs category (U+00A0, U+1680, U+2000-U+200A, U+202F,
    // U+205F, U+3000) and the line and paragraph separators U+2028 (Zl) and U+2029 (Zp).
    // ECMA-262 adds U+FEFF (a format character, Cf); White_Space adds U+0085 (a control).
    if (mask & U_GC_Z_MASK) return CharClass::space;
    if (rule == SpaceRule::javascript ? code == 0xFEFF : code == 0x85) return CharClass::space;
    return CharClass::other;
}

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

}  // namespace trident::data
