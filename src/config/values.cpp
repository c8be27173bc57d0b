// Reading one YAML scalar as a typed config value and writing it back (see values.h).
//
// Numbers are parsed here with std::from_chars rather than yaml-cpp's as<T>() so that every
// rejection says what was expected and what was found, and integers written as 1e3 are taken.
#include "config/values.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

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
    // A long value (a pasted file) is shown by its start and length: messages stay one line.
    constexpr std::size_t kShown = 64;
    if (text.size() > kShown)
        return quoted(std::string_view(text).substr(0, kShown)) + "... (" +
               std::to_string(text.size()) + " bytes)";
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

size_t edit_distance(std::string_view a, std::string_view b) {
    std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
    for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
    for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        for (size_t j = 1; j <= b.size(); ++j) {
            size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
                d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
    }
    return d[a.size()][b.size()];
}

Problem read_value(const YAML::Node& node, OptimizerName& out) {
    Problem problem = read_value<OptimizerName>(node, out);
    if (!problem || !node.IsScalar()) return problem;
    // The nearest name within a third of its length (at least 2 edits).
    const std::string& given = node.Scalar();
    const char* best = nullptr;
    size_t best_distance = std::max<size_t>(2, given.size() / 3) + 1;
    for (const char* name : EnumNames<OptimizerName>::names)
        if (const size_t d = edit_distance(given, name); d < best_distance) {
            best = name;
            best_distance = d;
        }
    if (best) *problem += std::string(" (did you mean ") + best + "?)";
    return problem;
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

Problem read_sources(const YAML::Node& node, std::vector<DataSource>& out, bool nullable,
                     YAML::Mark& at) {
    const std::string expected = "expected a path or a list of {path, weight}";
    if (node.IsNull()) {
        if (!nullable) return expected + ", got null";
        out.clear();
        return {};
    }
    if (node.IsScalar()) {
        if (node.Scalar().empty()) return "must not be empty";
        out = {DataSource{node.Scalar(), 1.0}};
        return {};
    }
    if (!node.IsSequence()) return expected + ", got " + describe(node);
    if (node.size() == 0) return expected + ", got an empty list";

    std::vector<DataSource> sources;
    for (std::size_t i = 0; i < node.size(); ++i) {
        const YAML::Node item = node[i];
        const std::string name = "item " + std::to_string(i + 1);
        at = item.Mark();
        if (!item.IsMap()) {
            std::string problem =
                name + ": expected {path: ..., weight: ...}, got " + describe(item);
            if (item.IsScalar())
                problem +=
                    " (each dataset of a blend has a weight; for one stream of several "
                    "llm.c files, write a glob)";
            return problem;
        }
        DataSource source;
        bool has_path = false, has_weight = false;
        for (const auto& entry : item) {
            at = entry.first.Mark();
            const std::string key = entry.first.IsScalar() ? entry.first.Scalar() : "";
            if (key == "path" || key == "weight") {
                bool& seen = key == "path" ? has_path : has_weight;
                if (seen) return name + ": " + key + " given twice";
                seen = true;
            }
            if (key == "path") {
                if (Problem p = read_value(entry.second, source.path))
                    return name + ": path: " + *p;
                if (source.path.empty()) return name + ": path: must not be empty";
            } else if (key == "weight") {
                if (Problem p = read_value(entry.second, source.weight))
                    return name + ": weight: " + *p;
                if (!(source.weight > 0))
                    return name + ": weight: must be > 0, got " + format_number(source.weight);
            } else {
                return name + ": unknown key " + describe(entry.first) +
                       " (an item has path and weight)";
            }
        }
        at = item.Mark();
        if (!has_path) return name + ": missing path";
        if (!has_weight) return name + ": missing weight";
        sources.push_back(std::move(source));
    }
    out = std::move(sources);
    at = YAML::Mark::null_mark();
    return {};
}

std::string yaml_text(int v) {
    return std::to_string(v);
}

std::string yaml_text(uint64_t v) {
    return std::to_string(v);
}

// Written with a decimal point ("1.0", "6.0e-04") so that YAML tools other than ours read a
// float too; the digits are the shortest that give back the same double.
std::string yaml_text(double v) {
    std::string text = format_number(v);
    if (!std::isfinite(v) || text.find('.') != std::string::npos) return text;
    size_t exponent = text.find('e');
    if (exponent == std::string::npos) return text + ".0";
    return text.insert(exponent, ".0");
}

std::string yaml_text(bool v) {
    return v ? "true" : "false";
}

// Strings are always quoted: then "null", "123" or "a: b" read back as the same string.
std::string yaml_text(const std::string& v) {
    return quoted(v);
}

std::string yaml_text(const std::optional<std::string>& v) {
    return v ? quoted(*v) : "null";
}

Problem read_value(const YAML::Node& node, StageLayers& out) {
    const std::string expected = "expected uniform, auto or a list of layer counts";
    if (node.IsScalar() && (node.Scalar() == "uniform" || node.Scalar() == "auto")) {
        out = StageLayers{node.Scalar() == "auto" ? StageCut::auto_ : StageCut::uniform, {}};
        return {};
    }
    if (!node.IsSequence() || node.size() == 0) return expected + ", got " + describe(node);
    StageLayers given{StageCut::given, {}};
    for (std::size_t i = 0; i < node.size(); ++i) {
        int count = 0;
        if (read_value(node[i], count) || count < 0)
            return "item " + std::to_string(i + 1) + ": expected a layer count >= 0, got " +
                   describe(node[i]);
        given.layers.push_back(count);
    }
    out = given;
    return {};
}

std::string yaml_text(const StageLayers& v) {
    if (v.cut != StageCut::given) return v.cut == StageCut::auto_ ? "auto" : "uniform";
    std::string out = "[";
    for (std::size_t i = 0; i < v.layers.size(); ++i)
        out += (i ? ", " : "") + std::to_string(v.layers[i]);
    return out + "]";
}

Problem read_value(const YAML::Node& node, std::vector<LoraTarget>& out, YAML::Mark& at) {
    std::string names;
    for (const char* name : EnumNames<LoraTarget>::names)
        names += (names.empty() ? "" : ", ") + std::string(name);
    const std::string expected = "expected a non-empty list of " + names;
    if (!node.IsSequence()) return expected + ", got " + describe(node);
    if (node.size() == 0) return expected + ", got an empty list";
    std::vector<LoraTarget> targets;
    for (std::size_t i = 0; i < node.size(); ++i) {
        const YAML::Node item = node[i];
        at = item.Mark();
        LoraTarget target{};
        if (Problem p = read_value(item, target))
            return "item " + std::to_string(i + 1) + ": " + *p;
        if (std::find(targets.begin(), targets.end(), target) != targets.end())
            return std::string(enum_name(target)) + " given twice";
        targets.push_back(target);
    }
    out = std::move(targets);
    at = YAML::Mark::null_mark();
    return {};
}

std::string yaml_text(const std::vector<LoraTarget>& v) {
    std::string out = "[";
    for (std::size_t i = 0; i < v.size(); ++i)
        out += (i ? ", " : "") + std::string(enum_name(v[i]));
    return out + "]";
}

std::string yaml_text(const std::vector<DataSource>& v) {
    if (v.empty()) return "null";
    if (v.size() == 1 && v[0].weight == 1.0) return quoted(v[0].path);
    std::string out = "[";
    for (const DataSource& s : v)
        out += (out.size() > 1 ? ", " : "") + std::string("{path: ") + quoted(s.path) +
               ", weight: " + yaml_text(s.weight) + "}";
    return out + "]";
}

}  // namespace trident::config::detail
