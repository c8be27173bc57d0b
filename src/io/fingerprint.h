// A cheap fingerprint of a large file: its size and the SHA-256 of a fixed sample of its
// bytes, so that a training file truncated or replaced between a checkpoint and its resume is
// noticed without reading terabytes. The sample is the size itself and kSampleBlocks blocks of
// kBlockBytes spread evenly from the first byte to the last (the whole file when it is
// smaller): truncation, growth and replacement by other data change it; an edit that misses
// every sampled block does not, which is the price of reading 256 KiB of any file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace trident::io {

inline constexpr std::size_t kSampleBlocks = 32;
inline constexpr std::size_t kBlockBytes = 8192;

struct Fingerprint {
    uint64_t bytes = 0;
    std::string sampled_sha256;  // 64 hex digits
    bool operator==(const Fingerprint&) const = default;
};

// Throws trident::Error naming the file when it cannot be read.
Fingerprint fingerprint_file(const std::string& path);

}  // namespace trident::io
