// The Split patterns of data/split_patterns.h: the Llama 3 and Qwen2 expressions' alternatives,
// tried in their order, as a scan over classified code points (GPT-2's is data/pretokenize.cpp).
#include "data/split_patterns.h"

#include "data/pretokenize.h"
#include "data/unicode_class.h"

namespace trident::data {

namespace {

constexpr std::string_view kGpt2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view kLlama3 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view kQwen2 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

constexpr SpaceRule kRule = SpaceRule::unicode;

Char at(std::string_view text, std::size_t pos) {
    return char_at(text, pos, kRule);
}

bool is_newline(std::string_view text, std::size_t pos) {
    return text[pos] == '\r' || text[pos] == '\n';
}

// The end of the run of at most `limit` characters of class `cls` that starts at `pos`.
std::size_t run_end(std::string_view text, std::size_t pos, CharClass cls,
                    std::size_t limit = SIZE_MAX) {
    for (std::size_t n = 0; n < limit && pos < text.size(); ++n) {
        const Char c = at(text, pos);
        if (c.cls != cls) break;
        pos += c.bytes;
    }
    return pos;
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d): its length at `start`, or 0. Case folding reaches beyond
// ASCII only for U+017F (long s, which folds to s) and U+212A (Kelvin sign, to k): the first
// matters, the second is in no contraction.
std::size_t contraction_length(std::string_view text, std::size_t start) {
    if (text[start] != '\'' || start + 1 == text.size()) return 0;
    const auto lower = [&](std::size_t i) {
        return i < text.size() ? static_cast<char>(text[i] | 0x20) : '\0';
    };
    const char a = lower(start + 1);
    if (text.substr(start + 1, 2) == "\xC5\xBF") return 3;  // 'ſ
    if (a == 's' || a == 't') return 2;
    const char b = lower(start + 2);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e')) return 3;
    if (a == 'm') return 2;
    if (a == 'l' && b == 'l') return 3;
    if (a == 'd') return 2;
    return 0;
}

// The whitespace alternatives \s*[\r\n]+ | \s+(?!\S) | \s+ at `start`, a whitespace character.
std::size_t space_end(std::string_view text, std::size_t start) {
    std::size_t pos = start, last = start, after_newline = 0;
    while (pos < text.size()) {
        const Char c = at(text, pos);
        if (c.cls != CharClass::space) break;
        last = pos;
        pos += c.bytes;
        if (is_newline(text, last)) after_newline = pos;
    }
    // \s*[\r\n]+: the greedy \s* gives back characters until the last CR or LF of the run.
    if (after_newline) return after_newline;
    // \s+(?!\S): the whole run at the end of the text, else all but its last character.
    if (pos == text.size() || last == start) return pos;
    return last;
}

std::size_t llama_end(std::string_view text, std::size_t start, std::size_t digits) {
    if (const std::size_t n = contraction_length(text, start)) return start + n;
    const Char first = at(text, start);
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (first.cls == CharClass::letter) return run_end(text, start, CharClass::letter);
    const std::size_t second = start + first.bytes;
    const bool takes_letters = first.cls != CharClass::number && !is_newline(text, start);
    if (takes_letters && second < text.size() && at(text, second).cls == CharClass::letter)
        return run_end(text, second, CharClass::letter);
    // \p{N}{1,3} (or \p{N})
    if (first.cls == CharClass::number) return run_end(text, start, CharClass::number, digits);
    // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    std::size_t others = first.cls == CharClass::other ? start : SIZE_MAX;
    if (text[start] == ' ' && second < text.size() && at(text, second).cls == CharClass::other)
        others = second;
    if (others != SIZE_MAX) {
        std::size_t end = run_end(text, others, CharClass::other);
        while (end < text.size() && is_newline(text, end)) ++end;
        return end;
    }
    return space_end(text, start);
}

}  // namespace

std::optional<SplitPattern> recognise_pattern(std::string_view regex) {
    if (regex == kGpt2) return SplitPattern::gpt2;
    if (regex == kLlama3) return SplitPattern::llama3;
    if (regex == kQwen2) return SplitPattern::qwen2;
    return std::nullopt;
}

std::string known_patterns() {
    std::string out;
    for (const std::string_view p : {kGpt2, kLlama3, kQwen2}) out += "\n  " + std::string(p);
    return out;
}

std::size_t split_end(SplitPattern pattern, std::string_view text, std::size_t start) {
    switch (pattern) {
        case SplitPattern::gpt2:
            return pretoken_end(text, start, kRule);
        case SplitPattern::llama3:
            return llama_end(text, start, 3);
        case SplitPattern::qwen2:
            return llama_end(text, start, 1);
    }
    return text.size();
}

}  // namespace trident::data
