// GPT-2's byte-to-unicode mapping of data/byte_level.h, read backwards.
#include "data/byte_level.h"

#include <array>

#include "data/unicode_class.h"
#include "io/json_reader.h"
#include "kernels/error.h"

namespace trident::data {

namespace {

// bytes_to_unicode(), inverted: the byte each code point below 324 stands for, or -1 for code
// points that stand for none.
constexpr std::array<int, 324> kByteOf = [] {
    std::array<int, 324> byte_of{};
    byte_of.fill(-1);
    const auto printable = [](int b) {
        return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int next = 256;
    for (int b = 0; b < 256; ++b) byte_of[printable(b) ? b : next++] = b;
    return byte_of;
}();

}  // namespace

std::string byte_level_bytes(std::string_view token) {
    std::string bytes;
    for (std::size_t pos = 0; pos < token.size();) {
        char32_t code = 0;
        const int length = utf8_sequence(token, pos, code);
        if (length == 0) throw Error("invalid UTF-8 in token " + io::json::quote(token));
        if (code >= kByteOf.size() || kByteOf[code] < 0)
            throw Error("token " + io::json::quote(token) +
                        " has a character that stands for no byte in GPT-2's mapping");
        bytes += static_cast<char>(kByteOf[code]);
        pos += static_cast<std::size_t>(length);
    }
    if (bytes.empty()) throw Error("empty token");
    return bytes;
}

}  // namespace trident::data
