// GPT-2's pre-tokenizer of data/pretokenize.h: the regular expression's alternatives, tried in
// its order, written out as a scan over classified code points.
#include "data/pretokenize.h"

namespace trident::data {

namespace {

// The end of the run of characters of class `cls` that starts at `pos`.
std::size_t run_end(std::string_view text, std::size_t pos, CharClass cls, SpaceRule rule) {
    while (pos < text.size()) {
        const Char c = char_at(text, pos, rule);
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

std::size_t pretoken_end(std::string_view text, std::size_t start, SpaceRule rule) {
    // 's|'t|'re|'ve|'m|'ll|'d
    if (text[start] == '\'') {
        const std::size_t n = contraction_length(text, start);
        if (n) return start + n;
    }
    // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': whatever follows a space that is not
    // whitespace is a letter, a number or "other", so one of the three takes the space.
    const Char first = char_at(text, start, rule);
    if (first.cls != CharClass::space) return run_end(text, start, first.cls, rule);
    if (text[start] == ' ' && start + 1 < text.size()) {
        const Char next = char_at(text, start + 1, rule);
        if (next.cls != CharClass::space) return run_end(text, start + 1, next.cls, rule);
    }
    // '\s+(?!\S)': the whole whitespace run at the end of the text, else the run less its last
    // character (which then leads the next piece); '\s+' when that leaves nothing.
    std::size_t pos = start, last = start;
    while (pos < text.size()) {
        const Char c = char_at(text, pos, rule);
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
