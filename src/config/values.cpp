// Reading one YAML scalar as a typed config value and writing it back (see values.h).
//
// Numbers are parsed here with std::from_chars rather than yaml-cpp's as<T>() so that every
// rejection says what was expected and what was found, and integers written as 1e3 are taken.
#include "config/values.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <string_view>
#include <system_error>

namespace trident::config::detail {
namespace {

// YAML allows a leading '+'; from_chars does not.
std::string_view without_plus(std::string_view text) {
    if (text.size() > 1 && text[0] == '+') text.remove_prefix(1);
    return text;
}

// The whole text as a number, or nothing.
std::optional<double> parse_number(std::string_view text) {
    text = without_plus(text);
    double v = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return {};
    return v;
}

// The whole text as an integer of type T, or nothing (also when it does not fit).
template <typename T>
std::optional<T> parse_integer(std::string_view text) {
    text = without_plus(text);
    T v = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return {};
    return v;
}

// An integral number such as "1e3" or "12.0" as a T, or nothing.
template <typename T>
std::optional<T> integral_number(std::string_view text) {
    std::optional<double> v = parse_number(text);
    if (!v || !std::isfinite(*v) || std::floor(*v) != *v) return {};
    // Strictly below max: a 64-bit max rounds up to 2^64 as a double, which does not fit.
    if (*v < static_cast<double>(std::numeric_limits<T>::lowest())) return {};
    if (*v >= static_cast<double>(std::numeric_limits<T>::max())) return {};
    return static_cast<T>(*v);
}

std::string quoted(std::string_view text) {
    static const char hex[] = "0123456789abcdef";
    std::string out = "\"";
    for (unsigned char c : text) {
        switch (c) {
            case '"':
                out += "\\\"";
                break;
            case '\\':
                out += "\\\\";
                break;
            case '\n':
                out += "\\n";
                break;
            case '\t':
                out += "\\t";
                break;
            case '\r':
                out += "\\r";
                break;
            default:
                if (c < 0x20 || c == 0x7f) {
                    out += "\\x";
                    out += hex[c >> 4];
                    out += hex[c & 15];
                } else {
                    out += static_cast<char>(c);
                }
        }
    }
    return out + "\"";
}

std::optional<bool> parse_bool(std::string_view text) {
    if (text == "true" || text == "True" || text == "TRUE") return true;
    if (text == "false" || text == "False" || text == "FALSE") return false;
    return {};
}

}  // namespace

std::string describe(const YAML::Node& node) {
    if (!node.IsDefined() || node.IsNull()) return "null";
    if (node.IsSequence()) return "a list";
    if (node.IsMap()) return "a map";
    const std::string& text = node.Scalar();
    if (parse_number(text) || parse_bool(text)) return text;
    return quoted(text);
}

std::string format_number(double v) {
    char buf[64];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, end);
}

Problem read_value(const YAML::Node& node, int& out) {
    if (node.IsScalar()) {
        const std::string& text = node.Scalar();
        if (auto v = parse_integer<int>(text)) {
            out = *v;
            return {};
        }
        if (auto v = integral_number<int>(text)) {
            out = *v;
            return {};
        }
        if (parse_integer<int64_t>(text) || integral_number<int64_t>(text))
            return "expected an integer that fits in 32 bits, got " + text;
    }
    return "expected an integer, got " + describe(node);
}

Problem read_value(const YAML::Node& node, uint64_t& out) {
    if (node.IsScalar()) {
        const std::string& text = node.Scalar();
        if (auto v = parse_integer<uint64_t>(text)) {
            out = *v;
            return {};
        }
        if (auto v = integral_number<uint64_t>(text)) {
            out = *v;
            return {};
        }
        if (parse_number(text)) return "expected a non-negative integer, got " + text;
    }
    return "expected a non-negative integer, got " + describe(node);
}

Problem read_value(const YAML::Node& node, double& out) {
    if (node.IsScalar()) {
        if (auto v = parse_number(node.Scalar())) {
            if (!std::isfinite(*v)) return "expected a finite number, got " + node.Scalar();
            out = *v;
            return {};
        }
    }
    return "expected a number, got " + describe(node);
}

Problem read_value(const YAML::Node& node, bool& out) {
    if (node.IsScalar()) {
        if (auto v = parse_bool(node.Scalar())) {
            out = *v;
            return {};
        }
    }
    return "expected true or false, got " + describe(node);
}

Problem read_value(const YAML::Node& node, std::string& out) {
    if (!node.IsScalar()) return "expected a string, got " + describe(node);
    out = node.Scalar();
    return {};
}

Problem read_value(const YAML::Node& node, std::optional<std::string>& out) {
    if (node.IsNull()) {
        out.reset();
        return {};
    }
    if (!node.IsScalar()) return "expected a string or null, got " + describe(node);
    out = node.Scalar();
    return {};
}

std::string yaml_text(int v) { return std::to_string(v); }

std::string yaml_text(uint64_t v) { return std::to_string(v); }

// Written with a decimal point ("1.0", "6.0e-04") so that YAML tools other than ours read a
// float too; the digits are the shortest that give back the same double.
std::string yaml_text(double v) {
    std::string text = format_number(v);
    if (!std::isfinite(v) || text.find('.') != std::string::npos) return text;
    size_t exponent = text.find('e');
    if (exponent == std::string::npos) return text + ".0";
    return text.insert(exponent, ".0");
}

std::string yaml_text(bool v) { return v ? "true" : "false"; }

// Strings are always quoted: then "null", "123" or "a: b" read back as the same string.
std::string yaml_text(const std::string& v) { return quoted(v); }

std::string yaml_text(const std::optional<std::string>& v) { return v ? quoted(*v) : "null"; }

}  // namespace trident::config::detail
