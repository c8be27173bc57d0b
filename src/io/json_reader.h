// A small, strict JSON reader: enough for a safetensors header (objects, arrays, strings with
// escapes, integers) and nothing clever. Input comes from untrusted files, so every malformed
// byte is an error with its offset, nesting is bounded, and integers are checked for overflow.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace trident::io::json {

struct Member;

struct Value {
    enum class Kind { null, boolean, integer, real, string, array, object };

    Kind kind = Kind::null;
    bool boolean = false;
    int64_t integer = 0;         // Kind::integer: a number without fraction or exponent
    double real = 0.0;           // Kind::real: any other number
    std::string string;          // Kind::string, UTF-8
    std::vector<Value> array;    // Kind::array
    std::vector<Member> object;  // Kind::object, in document order, keys unique

    bool is_object() const { return kind == Kind::object; }
    bool is_array() const { return kind == Kind::array; }
    bool is_string() const { return kind == Kind::string; }
    bool is_integer() const { return kind == Kind::integer; }

    // The member of that key, or nullptr (objects only).
    const Value* find(std::string_view key) const;
};

struct Member {
    std::string key;
    Value value;
};

// Parses one JSON document; whitespace may follow it, nothing else. Throws trident::Error
// ("byte N: what went wrong") on malformed text, invalid UTF-8, duplicate object keys,
// integers outside int64 or nesting deeper than 64.
Value parse(std::string_view text);

// The string of top-level key `key` of the JSON object `text` (one object, whitespace around it
// allowed), appended to `out`: the whole object checked as parse() checks it, nothing kept of
// its other members. Throws as parse() does, `out` as it was, and also where the object has no
// such key ("no \"text\" key") or it holds another kind ("\"text\" is a JSON null, not a
// string"). For JSON-lines corpora (`trident tokenize`), where building every member's value
// would cost more than the check.
void string_member(std::string_view text, std::string_view key, std::string& out);

// `text` as a JSON string literal, quotes included.
std::string quote(std::string_view text);

// A short name of a value's kind for messages ("string", "array", ...).
const char* kind_name(Value::Kind kind);

}  // namespace trident::io::json
