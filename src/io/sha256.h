// SHA-256 (FIPS 180-4): the checksum a checkpoint's manifest records for each of its files, so
// a flipped bit or a truncated file is found before its numbers are trusted.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace trident::io {

class Sha256 {
public:
    Sha256();
    void update(const void* data, std::size_t size);
    // The digest as 64 lowercase hex digits; the object is spent afterwards.
    std::string hex_digest();

private:
    void block(const uint8_t* p);  // one 64-byte block into state_

    std::array<uint32_t, 8> state_;
    std::array<uint8_t, 64> buffer_{};
    std::size_t buffered_ = 0;
    uint64_t length_ = 0;  // bytes so far
};

std::string sha256_hex(std::string_view bytes);
// The file's digest; throws trident::Error naming the file when it cannot be read.
std::string sha256_file(const std::string& path);

}  // namespace trident::io
