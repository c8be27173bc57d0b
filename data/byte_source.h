// A corpus file read front to back as a stream of bytes, decompressed as its name says: ".gz"
// with zlib (every gzip member, as gzip -d reads concatenated ones), ".zst" with libzstd (every
// frame), anything else as it is. Memory is a read buffer and the decompressor's window, not
// the file; `trident tokenize` reads JSON-lines corpora so (data/json_field.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace trident::data {

enum class Compression { none, gzip, zstd };

// By the name's last extension: .gz, .zst, else none.
Compression compression_of(const std::string& path);

class ByteSource {
public:
    virtual ~ByteSource() = default;
    // Fills `out` with the next bytes of the stream; fewer only at its end, 0 once there.
    // Throws trident::Error naming the file: unreadable, not of its compression (checked on the
    // first bytes), corrupt, or cut short (a stream that ends inside a frame or member).
    virtual std::size_t read(std::span<char> out) = 0;
    // Bytes of the file itself consumed so far, against its size for progress.
    virtual uint64_t consumed() const = 0;
};

// Opens `path` (a regular file: io/input_file.h) as its name says.
std::unique_ptr<ByteSource> open_byte_source(const std::string& path);

}  // namespace trident::data
