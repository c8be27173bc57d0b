// Reading and writing safetensors files: an 8-byte little-endian header length N, N bytes of
// JSON header naming each tensor's dtype, shape and byte range, then the data buffer.
//
// The reader trusts nothing: a checkpoint may be truncated, hand-edited or not a safetensors
// file at all, so open() checks the whole header (valid JSON and UTF-8, known dtypes, sizes
// that match shapes, ranges that tile the data buffer exactly) and throws trident::Error
// naming the file. Tensor data is read on demand with pread, so opening a large checkpoint
// costs only its header. The writer writes F32, F16 or BF16 (what Trident keeps), to a
// temporary file renamed into place, so a crash never leaves a half-written file under the
// real name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/dtype.h"

namespace trident::io {

using kernels::DType;

// The format's spelling of an element type: "F32", "BF16", "I64", "BOOL", "F8_E4M3", ...
std::string_view safetensors_name(DType dtype);
std::string shape_string(std::span<const int64_t> shape);  // "[768, 2304]"

struct TensorInfo {
    std::string name;
    DType dtype = DType::f32;
    std::vector<int64_t> shape;
    std::size_t numel = 0;       // product of shape (1 for a scalar)
    std::size_t data_begin = 0;  // byte range relative to the start of the data buffer
    std::size_t data_end = 0;
};

class SafetensorsFile {
public:
    // Opens and validates `path`; throws trident::Error naming the file on any fault.
    static SafetensorsFile open(const std::string& path);

    SafetensorsFile(SafetensorsFile&& other) noexcept;
    SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
    SafetensorsFile(const SafetensorsFile&) = delete;
    SafetensorsFile& operator=(const SafetensorsFile&) = delete;
    ~SafetensorsFile();

    const std::string& path() const { return path_; }
    const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in data order
    std::vector<std::string> names() const;                              // in data order
    const TensorInfo* find(std::string_view name) const;                 // nullptr if absent
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    // The SHA-256 of the file's first 8 + N bytes (the length and the header), which open()
    // read whole.
    const std::string& header_sha256() const { return header_sha256_; }
    // Bytes read from the file so far: the header, then every tensor read.
    uint64_t bytes_read() const { return bytes_read_; }

    // The tensor's values as float, converted from F32, F16 or BF16; other dtypes are an error.
    std::vector<float> read_f32(std::string_view name) const;
    // Same, into `out` of exactly tensor.numel floats (no allocation).
    void read_f32(const TensorInfo& tensor, std::span<float> out) const;
    // The tensor's bytes as stored, into `out` of exactly data_end - data_begin bytes.
    void read_raw(const TensorInfo& tensor, std::span<char> out) const;

private:
    SafetensorsFile() = default;

    std::string path_;
    int fd_ = -1;
    std::size_t data_start_ = 0;  // file offset of the data buffer: 8 + N
    std::vector<TensorInfo> tensors_;
    std::map<std::string, std::size_t, std::less<>> index_;  // name -> position in tensors_
    std::map<std::string, std::string> metadata_;
    std::string header_sha256_;
    mutable uint64_t bytes_read_ = 0;
};

// One tensor to write; `data` holds product(shape) elements of `dtype` (F32: floats; F16,
// BF16: uint16_t bit patterns) and must outlive the call.
struct TensorToWrite {
    std::string name;
    std::vector<int64_t> shape;
    const void* data = nullptr;
    DType dtype = DType::f32;
};

// What a write put on the disk, hashed as it was written.
struct WrittenFile {
    uint64_t bytes = 0;
    std::string sha256;         // of the whole file
    std::string header_sha256;  // of its first 8 + N bytes, as SafetensorsFile::header_sha256
};

// Writes a safetensors file (F32, F16 or BF16 tensors): header keys sorted by name (data in
// the same order), padded with spaces to a multiple of 8 bytes. Written to `path`.tmp.<pid>
// and renamed over `path` once complete. Throws trident::Error on duplicate names or any I/O
// failure.
WrittenFile write_safetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace trident::io
