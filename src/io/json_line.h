// One JSON object on one line, built field by field: the metrics file's records, and the
// plan's one object (with nested objects and arrays).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>

namespace trident::io {

class JsonLine {
public:
    JsonLine& add(std::string_view key, double value) {
        char buf[32];
        // %.9g round-trips a float exactly; non-finite numbers have no JSON form.
        if (std::isfinite(value))
            std::snprintf(buf, sizeof buf, "%.9g", value);
        else
            std::snprintf(buf, sizeof buf, "null");
        return raw(key, buf);
    }
    // %.17g: a double that must come back bitwise (a checkpoint's loss scale).
    JsonLine& add_exact(std::string_view key, double value) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.17g", value);
        return raw(key, buf);
    }
    JsonLine& add(std::string_view key, int64_t value) { return raw(key, std::to_string(value)); }
    JsonLine& add(std::string_view key, int value) { return add(key, static_cast<int64_t>(value)); }
    JsonLine& add(std::string_view key, bool value) { return raw(key, value ? "true" : "false"); }
    // Without this overload a string literal would convert to bool, not string_view.
    JsonLine& add(std::string_view key, const char* value) {
        return add(key, std::string_view(value));
    }
    JsonLine& add(std::string_view key, std::string_view value) { return raw(key, quote(value)); }
    // A nested object, an array of objects, of integers, of strings.
    JsonLine& add(std::string_view key, const JsonLine& object) { return raw(key, object.str()); }
    JsonLine& add(std::string_view key, std::span<const JsonLine> objects) {
        std::string items;
        for (const JsonLine& o : objects) items += (items.empty() ? "" : ", ") + o.str();
        return raw(key, "[" + items + "]");
    }
    JsonLine& add(std::string_view key, std::span<const int64_t> values) {
        std::string items;
        for (int64_t v : values) items += (items.empty() ? "" : ", ") + std::to_string(v);
        return raw(key, "[" + items + "]");
    }
    // Doubles that must come back bitwise, as add_exact.
    JsonLine& add_exact(std::string_view key, std::span<const double> values) {
        std::string items;
        char buf[32];
        for (double v : values) {
            std::snprintf(buf, sizeof buf, "%.17g", v);
            items += (items.empty() ? "" : ", ") + std::string(buf);
        }
        return raw(key, "[" + items + "]");
    }
    JsonLine& add(std::string_view key, std::span<const std::string> values) {
        std::string items;
        for (const std::string& v : values) items += (items.empty() ? "" : ", ") + quote(v);
        return raw(key, "[" + items + "]");
    }
    JsonLine& add_null(std::string_view key) { return raw(key, "null"); }
    std::string str() const { return "{" + body_ + "}"; }

private:
    static std::string quote(std::string_view value) {
        std::string quoted = "\"";
        for (char c : value) {
            if (c == '"' || c == '\\') quoted += '\\';
            if (static_cast<unsigned char>(c) < 0x20) {
                char esc[8];
                std::snprintf(esc, sizeof esc, "\\u%04x", c);
                quoted += esc;
                continue;
            }
            quoted += c;
        }
        return quoted + "\"";
    }
    JsonLine& raw(std::string_view key, const std::string& value) {
        if (!body_.empty()) body_ += ", ";
        body_ += "\"";
        body_ += key;
        body_ += "\": ";
        body_ += value;
        return *this;
    }
    std::string body_;
};

}  // namespace trident::io
