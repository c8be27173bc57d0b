// One Hugging Face config.json's fields, each read with the file named in its error: what the
// llama family's reader (model/hf_llama_config.h) and its mixtures of experts'
// (model/hf_moe_config.h) take from it.
#pragma once

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "io/json_reader.h"
#include "kernels/error.h"

namespace trident::model {

// One config.json's fields, each read with the file named in its error.
class HfFields {
public:
    HfFields(std::string path, io::json::Value root)
        : path_(std::move(path)), root_(std::move(root)) {}

    const io::json::Value* find(const char* key) const {
        const io::json::Value* v = root_.find(key);
        return v && v->kind != io::json::Value::Kind::null ? v : nullptr;
    }
    int positive(const char* key, int absent = 0) const {
        const io::json::Value* v = find(key);
        if (!v && absent > 0) return absent;
        if (!v || !v->is_integer() || v->integer < 1 || v->integer > (1 << 30))
            throw Error(path_ + ": no positive integer \"" + key + "\"");
        return static_cast<int>(v->integer);
    }
    double number(const char* key, double absent) const {
        const io::json::Value* v = find(key);
        if (!v) return absent;
        const double x = v->is_integer() ? static_cast<double>(v->integer) : v->real;
        if ((!v->is_integer() && v->kind != io::json::Value::Kind::real) || !(x > 0) ||
            !std::isfinite(x))
            throw Error(path_ + ": \"" + key + "\" must be a positive number");
        return x;
    }
    bool flag(const char* key, bool absent) const {
        const io::json::Value* v = find(key);
        if (!v) return absent;
        if (v->kind != io::json::Value::Kind::boolean)
            throw Error(path_ + ": \"" + key + "\" must be true or false");
        return v->boolean;
    }
    std::string text(const char* key, const char* absent) const {
        const io::json::Value* v = find(key);
        if (!v) return absent;
        if (!v->is_string()) throw Error(path_ + ": \"" + key + "\" must be a string");
        return v->string;
    }
    double non_negative(const char* key, double absent) const {
        const io::json::Value* v = find(key);
        if (!v) return absent;
        const double x = v->is_integer() ? static_cast<double>(v->integer) : v->real;
        if ((!v->is_integer() && v->kind != io::json::Value::Kind::real) || !(x >= 0) ||
            !std::isfinite(x))
            throw Error(path_ + ": \"" + key + "\" must be a number at least 0");
        return x;
    }
    // A list of integers (absent: empty).
    std::vector<int> integers(const char* key) const {
        std::vector<int> out;
        const io::json::Value* v = find(key);
        if (!v) return out;
        if (!v->is_array()) throw Error(path_ + ": \"" + key + "\" must be a list of integers");
        for (const io::json::Value& x : v->array) {
            if (!x.is_integer() || x.integer < 0 || x.integer > (1 << 30))
                throw Error(path_ + ": \"" + key + "\" must be a list of integers");
            out.push_back(static_cast<int>(x.integer));
        }
        return out;
    }
    [[noreturn]] void refuse(const std::string& what) const {
        throw Error(path_ + ": " + what + ", which Trident's llama does not implement");
    }

private:
    std::string path_;
    io::json::Value root_;
};

}  // namespace trident::model
