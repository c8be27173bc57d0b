// Recursive-descent JSON parser of src/io/json_reader.h.
#include "io/json_reader.h"

#include <algorithm>
#include <charconv>
#include <unordered_set>

#include "io/utf8.h"
#include "kernels/error.h"

namespace trident::io::json {

namespace {

constexpr int kMaxDepth = 64;

class Parser {
public:
    explicit Parser(std::string_view text) : text_(text) {}

    Value document() {
        skip_whitespace();
        Value v = value(0);
        end_of_document();
        return v;
    }

    // The object's members checked as object() checks them; the string of `key` decoded into
    // `out` on the way, the others read and dropped.
    void member_string(std::string_view key, std::string& out) {
        skip_whitespace();
        if (peek() != '{' || at_end()) fail("expected a JSON object");
        ++pos_;
        std::vector<std::string> keys;
        bool found = false;
        skip_whitespace();
        const bool empty = peek() == '}' && !at_end();
        while (!empty) {
            found |= member(key, keys, out);
            skip_whitespace();
            if (peek() == '}' && !at_end()) break;
            if (peek() != ',' || at_end()) fail("expected ',' or '}'");
            ++pos_;
            skip_whitespace();
        }
        ++pos_;
        end_of_document();
        if (!found) fail("no " + quote(key) + " key");
    }

private:
    // One member of member_string's object: true when it is `key`'s, decoded into `out`.
    bool member(std::string_view key, std::vector<std::string>& keys, std::string& out) {
        if (peek() != '"' || at_end()) fail("expected a string key");
        const std::size_t key_pos = pos_;
        keys.push_back(string());
        if (std::find(keys.begin(), keys.end() - 1, keys.back()) != keys.end() - 1) {
            pos_ = key_pos;
            fail("duplicate key " + quote(keys.back()));
        }
        skip_whitespace();
        expect(':');
        skip_whitespace();
        if (keys.back() != key) {
            value(1);
            return false;
        }
        if (peek() != '"' || at_end())
            fail(quote(key) + " is a JSON " + kind_name(value(1).kind) + ", not a string");
        string_into(out);
        return true;
    }

    void end_of_document() {
        skip_whitespace();
        if (pos_ != text_.size()) fail("unexpected text after the JSON value");
    }

    [[noreturn]] void fail(const std::string& what) const {
        throw Error("byte " + std::to_string(pos_) + ": " + what);
    }

    bool at_end() const { return pos_ >= text_.size(); }
    char peek() const { return at_end() ? '\0' : text_[pos_]; }

    void skip_whitespace() {
        while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r'))
            ++pos_;
    }

    void expect(char c) {
        if (peek() != c || at_end()) fail(std::string("expected '") + c + "'");
        ++pos_;
    }

    Value value(int depth) {
        if (depth > kMaxDepth) fail("nesting deeper than " + std::to_string(kMaxDepth));
        if (at_end()) fail("unexpected end of text");
        const char c = peek();
        if (c == '{') return object(depth);
        if (c == '[') return array(depth);
        if (c == '"') {
            Value v;
            v.kind = Value::Kind::string;
            v.string = string();
            return v;
        }
        if (c == '-' || (c >= '0' && c <= '9')) return number();
        if (literal("true")) return boolean(true);
        if (literal("false")) return boolean(false);
        if (literal("null")) return Value{};
        fail("unexpected character");
    }

    bool literal(std::string_view word) {
        if (text_.substr(pos_, word.size()) != word) return false;
        pos_ += word.size();
        return true;
    }

    static Value boolean(bool b) {
        Value v;
        v.kind = Value::Kind::boolean;
        v.boolean = b;
        return v;
    }

    Value object(int depth) {
        Value v;
        v.kind = Value::Kind::object;
        std::unordered_set<std::string> keys;
        expect('{');
        skip_whitespace();
        if (peek() == '}' && !at_end()) {
            ++pos_;
            return v;
        }
        for (;;) {
            skip_whitespace();
            if (peek() != '"' || at_end()) fail("expected a string key");
            const std::size_t key_pos = pos_;
            std::string key = string();
            if (!keys.insert(key).second) {
                pos_ = key_pos;
                fail("duplicate key " + quote(key));
            }
            skip_whitespace();
            expect(':');
            skip_whitespace();
            v.object.push_back(Member{std::move(key), value(depth + 1)});
            skip_whitespace();
            if (peek() == ',' && !at_end()) {
                ++pos_;
                continue;
            }
            expect('}');
            return v;
        }
    }

    Value array(int depth) {
        Value v;
        v.kind = Value::Kind::array;
        expect('[');
        skip_whitespace();
        if (peek() == ']' && !at_end()) {
            ++pos_;
            return v;
        }
        for (;;) {
            skip_whitespace();
            v.array.push_back(value(depth + 1));
            skip_whitespace();
            if (peek() == ',' && !at_end()) {
                ++pos_;
                continue;
            }
            expect(']');
            return v;
        }
    }

    // JSON number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
    Value number() {
        const std::size_t start = pos_;
        auto digits = [&] {
            const std::size_t from = pos_;
            while (!at_end() && peek() >= '0' && peek() <= '9') ++pos_;
            return pos_ - from;
        };
        if (peek() == '-') ++pos_;
        if (peek() == '0' && !at_end()) {
            ++pos_;
        } else if (digits() == 0) {
            fail("malformed number");
        }
        bool integral = true;
        if (peek() == '.' && !at_end()) {
            ++pos_;
            integral = false;
            if (digits() == 0) fail("malformed number");
        }
        if ((peek() == 'e' || peek() == 'E') && !at_end()) {
            ++pos_;
            integral = false;
            if ((peek() == '+' || peek() == '-') && !at_end()) ++pos_;
            if (digits() == 0) fail("malformed number");
        }
        const char* first = text_.data() + start;
        const char* last = text_.data() + pos_;
        Value v;
        if (integral) {
            v.kind = Value::Kind::integer;
            const auto [end, ec] = std::from_chars(first, last, v.integer);
            if (ec != std::errc() || end != last) {
                pos_ = start;
                fail("integer out of the 64-bit range");
            }
        } else {
            v.kind = Value::Kind::real;
            const auto [end, ec] = std::from_chars(first, last, v.real);
            if (ec != std::errc() || end != last) {
                pos_ = start;
                fail("number out of range");
            }
        }
        return v;
    }

    unsigned hex4() {
        if (pos_ + 4 > text_.size()) fail("truncated \\u escape");
        unsigned code = 0;
        for (int i = 0; i < 4; ++i) {
            const char c = text_[pos_++];
            code <<= 4;
            if (c >= '0' && c <= '9')
                code |= static_cast<unsigned>(c - '0');
            else if (c >= 'a' && c <= 'f')
                code |= static_cast<unsigned>(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F')
                code |= static_cast<unsigned>(c - 'A' + 10);
            else
                fail("bad hex digit in \\u escape");
        }
        return code;
    }

    // One raw UTF-8 sequence starting at pos_ (its lead byte >= 0x80), checked and copied:
    // no overlong forms, no surrogates, nothing past U+10FFFF.
    void copy_utf8_sequence(std::string& out) {
        const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text_[i]); };
        const unsigned lead = byte(pos_);
        int extra = 0;
        unsigned code = 0, min = 0;
        if ((lead & 0xE0) == 0xC0)
            extra = 1, code = lead & 0x1F, min = 0x80;
        else if ((lead & 0xF0) == 0xE0)
            extra = 2, code = lead & 0x0F, min = 0x800;
        else if ((lead & 0xF8) == 0xF0)
            extra = 3, code = lead & 0x07, min = 0x10000;
        else
            fail("invalid UTF-8");
        if (pos_ + static_cast<std::size_t>(extra) >= text_.size()) fail("truncated UTF-8");
        for (int i = 1; i <= extra; ++i) {
            const unsigned b = byte(pos_ + static_cast<std::size_t>(i));
            if ((b & 0xC0) != 0x80) fail("invalid UTF-8");
            code = (code << 6) | (b & 0x3F);
        }
        if (code < min || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF))
            fail("invalid UTF-8");
        out.append(text_.substr(pos_, static_cast<std::size_t>(extra) + 1));
        pos_ += static_cast<std::size_t>(extra) + 1;
    }

    std::string string() {
        std::string out;
        string_into(out);
        return out;
    }

    // Appends the string at pos_, decoded. Runs of plain ASCII go in whole (the bulk of a
    // document's text).
    void string_into(std::string& out) {
        expect('"');
        for (;;) {
            const std::size_t run = pos_;
            while (pos_ < text_.size() && plain(static_cast<unsigned char>(text_[pos_]))) ++pos_;
            out.append(text_.substr(run, pos_ - run));
            if (at_end()) fail("unterminated string");
            const auto c = static_cast<unsigned char>(text_[pos_]);
            if (c == '"') {
                ++pos_;
                return;
            }
            if (c < 0x20) fail("control character in string");
            if (c >= 0x80) {
                copy_utf8_sequence(out);
                continue;
            }
            ++pos_;
            if (c != '\\') {
                out += static_cast<char>(c);
                continue;
            }
            if (at_end()) fail("unterminated string");
            const char e = text_[pos_++];
            switch (e) {
                case '"':
                    out += '"';
                    break;
                case '\\':
                    out += '\\';
                    break;
                case '/':
                    out += '/';
                    break;
                case 'b':
                    out += '\b';
                    break;
                case 'f':
                    out += '\f';
                    break;
                case 'n':
                    out += '\n';
                    break;
                case 'r':
                    out += '\r';
                    break;
                case 't':
                    out += '\t';
                    break;
                case 'u': {
                    unsigned code = hex4();
                    if (code >= 0xDC00 && code <= 0xDFFF) fail("lone low surrogate in \\u escape");
                    if (code >= 0xD800 && code <= 0xDBFF) {
                        if (!literal("\\u")) fail("high surrogate without its low half");
                        const unsigned low = hex4();
                        if (low < 0xDC00 || low > 0xDFFF)
                            fail("high surrogate without its low half");
                        code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
                    }
                    io::append_utf8(out, static_cast<char32_t>(code));
                    break;
                }
                default:
                    --pos_;
                    fail("unknown escape");
            }
        }
    }

    // A byte a string holds as it is: ASCII, neither a control character, '"' nor '\\'.
    static bool plain(unsigned char c) { return c >= 0x20 && c < 0x80 && c != '"' && c != '\\'; }

    std::string_view text_;
    std::size_t pos_ = 0;
};

}  // namespace

const Value* Value::find(std::string_view key) const {
    for (const auto& m : object)
        if (m.key == key) return &m.value;
    return nullptr;
}

Value parse(std::string_view text) {
    return Parser(text).document();
}

void string_member(std::string_view text, std::string_view key, std::string& out) {
    const std::size_t before = out.size();
    try {
        Parser(text).member_string(key, out);
    } catch (const Error&) {
        out.resize(before);
        throw;
    }
}

std::string quote(std::string_view text) {
    static const char* hex = "0123456789abcdef";
    std::string out = "\"";
    for (const char ch : text) {
        const auto c = static_cast<unsigned char>(ch);
        if (c == '"')
            out += "\\\"";
        else if (c == '\\')
            out += "\\\\";
        else if (c == '\n')
            out += "\\n";
        else if (c == '\t')
            out += "\\t";
        else if (c == '\r')
            out += "\\r";
        else if (c < 0x20) {
            out += "\\u00";
            out += hex[c >> 4];
            out += hex[c & 0xF];
        } else {
            out += ch;
        }
    }
    out += '"';
    return out;
}

const char* kind_name(Value::Kind kind) {
    switch (kind) {
        case Value::Kind::null:
            return "null";
        case Value::Kind::boolean:
            return "boolean";
        case Value::Kind::integer:
            return "integer";
        case Value::Kind::real:
            return "number";
        case Value::Kind::string:
            return "string";
        case Value::Kind::array:
            return "array";
        case Value::Kind::object:
            return "object";
    }
    return "value";
}

}  // namespace trident::io::json
