// The safetensors reader and writer of src/io/safetensors.h.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <utility>

#include "io/input_file.h"
#include "io/json_reader.h"
#include "io/output_file.h"
#include "io/sha256.h"
#include "kernels/error.h"

namespace trident::io {

// Tensor bytes go straight between file and float buffers.
static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

// The reference implementation refuses headers above 100 MB; so do we, which also bounds what
// a corrupt length field can make us allocate.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// Every dtype the format defines, with its spelling in headers.
struct DtypeName {
    DType dtype;
    std::string_view name;
};

constexpr DtypeName kDtypes[] = {
    {DType::boolean, "BOOL"},    {DType::u8, "U8"},           {DType::i8, "I8"},
    {DType::i16, "I16"},         {DType::u16, "U16"},         {DType::i32, "I32"},
    {DType::u32, "U32"},         {DType::i64, "I64"},         {DType::u64, "U64"},
    {DType::f8_e4m3, "F8_E4M3"}, {DType::f8_e5m2, "F8_E5M2"}, {DType::f16, "F16"},
    {DType::bf16, "BF16"},       {DType::f32, "F32"},         {DType::f64, "F64"},
};

// Reads exactly `size` bytes at `offset`; false if the file ends first.
bool pread_all(int fd, void* buffer, std::size_t size, uint64_t offset, std::string* why) {
    auto* out = static_cast<char*>(buffer);
    while (size > 0) {
        const ssize_t got = ::pread(fd, out, size, static_cast<off_t>(offset));
        if (got < 0) {
            if (errno == EINTR) continue;
            *why = errno_text(errno);
            return false;
        }
        if (got == 0) {
            *why = "unexpected end of file";
            return false;
        }
        out += got;
        size -= static_cast<std::size_t>(got);
        offset += static_cast<uint64_t>(got);
    }
    return true;
}

// A non-negative JSON integer, or an error naming `what`.
uint64_t non_negative(const json::Value& v, const std::string& what) {
    if (!v.is_integer() || v.integer < 0)
        throw Error(what + " must be a non-negative integer, got a " +
                    (v.is_integer() ? std::string("negative integer") : json::kind_name(v.kind)));
    return static_cast<uint64_t>(v.integer);
}

// One header entry other than __metadata__, checked on its own (ranges are checked later).
TensorInfo parse_tensor_entry(const std::string& name, const json::Value& entry) {
    const std::string where = "tensor " + json::quote(name);
    if (!entry.is_object())
        throw Error(where + ": expected an object, got a " + json::kind_name(entry.kind));
    for (const auto& m : entry.object)
        if (m.key != "dtype" && m.key != "shape" && m.key != "data_offsets")
            throw Error(where + ": unknown field " + json::quote(m.key));
    const json::Value* dtype = entry.find("dtype");
    const json::Value* shape = entry.find("shape");
    const json::Value* offsets = entry.find("data_offsets");
    if (!dtype || !shape || !offsets)
        throw Error(where + ": missing field \"" +
                    (!dtype   ? "dtype"
                     : !shape ? "shape"
                              : "data_offsets") +
                    "\"");

    TensorInfo t;
    t.name = name;
    if (!dtype->is_string()) throw Error(where + ": dtype must be a string");
    const auto known = std::find_if(std::begin(kDtypes), std::end(kDtypes),
                                    [&](const DtypeName& e) { return e.name == dtype->string; });
    if (known == std::end(kDtypes))
        throw Error(where + ": unknown dtype " + json::quote(dtype->string));
    t.dtype = known->dtype;

    if (!shape->is_array()) throw Error(where + ": shape must be an array of integers");
    uint64_t numel = 1;
    bool overflow = false;
    for (const auto& d : shape->array) {
        const uint64_t dim = non_negative(d, where + ": every shape dimension");
        t.shape.push_back(static_cast<int64_t>(dim));
        overflow = overflow || __builtin_mul_overflow(numel, dim, &numel);
    }
    uint64_t bytes = 0;
    if (overflow || __builtin_mul_overflow(numel, kernels::size_of(known->dtype), &bytes))
        throw Error(where + ": shape " + shape_string(t.shape) + " is too large");

    if (!offsets->is_array() || offsets->array.size() != 2)
        throw Error(where + ": data_offsets must be an array of two integers [begin, end]");
    const uint64_t begin = non_negative(offsets->array[0], where + ": data_offsets begin");
    const uint64_t end = non_negative(offsets->array[1], where + ": data_offsets end");
    const std::string range = "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
    if (end < begin) throw Error(where + ": data_offsets " + range + " end before they begin");
    if (end - begin != bytes)
        throw Error(where + ": dtype " + std::string(known->name) + " and shape " +
                    shape_string(t.shape) + " need " + std::to_string(bytes) +
                    " bytes, but data_offsets " + range + " hold " + std::to_string(end - begin));
    t.numel = static_cast<std::size_t>(numel);
    t.data_begin = static_cast<std::size_t>(begin);
    t.data_end = static_cast<std::size_t>(end);
    return t;
}

// An error about the file at `path`, naming it.
Error file_error(const std::string& path, const std::string& what) {
    return Error(path + ": " + what);
}

// What the file's first 8 + N bytes hold: the header's length N, then N bytes of JSON.
struct RawHeader {
    uint64_t size = 0;
    std::string text;
    std::string sha256;  // of the length and the header together
};

// Reads the header of the file_size-byte file open as fd, its length checked against the
// file's size and kMaxHeaderBytes before anything is allocated for it.
RawHeader read_raw_header(int fd, const std::string& path, uint64_t file_size) {
    const auto fail = [&](const std::string& what) { return file_error(path, what); };
    std::string why;
    unsigned char length_bytes[8];
    if (!pread_all(fd, length_bytes, 8, 0, &why)) throw fail("cannot read: " + why);
    RawHeader raw;
    for (int i = 7; i >= 0; --i) raw.size = (raw.size << 8) | length_bytes[i];
    if (raw.size > file_size - 8)
        throw fail("header length " + std::to_string(raw.size) + " runs past the end of the " +
                   std::to_string(file_size) +
                   "-byte file (truncated, or not a safetensors file?)");
    if (raw.size > kMaxHeaderBytes)
        throw fail("header length " + std::to_string(raw.size) + " exceeds the limit of " +
                   std::to_string(kMaxHeaderBytes) + " bytes");
    raw.text.assign(static_cast<std::size_t>(raw.size), '\0');
    if (!pread_all(fd, raw.text.data(), raw.text.size(), 8, &why))
        throw fail("cannot read: " + why);
    Sha256 header_hash;
    header_hash.update(length_bytes, 8);
    header_hash.update(raw.text.data(), raw.text.size());
    raw.sha256 = header_hash.hex_digest();
    return raw;
}

// The header's members: __metadata__'s strings into `metadata`, every other member a tensor
// appended to `tensors`, its data inside the buffer_size-byte data buffer.
void read_members(const json::Value& root, uint64_t buffer_size, const std::string& path,
                  std::map<std::string, std::string>& metadata, std::vector<TensorInfo>& tensors) {
    const auto fail = [&](const std::string& what) { return file_error(path, what); };
    for (const auto& member : root.object) {
        if (member.key == "__metadata__") {
            if (!member.value.is_object()) throw fail("__metadata__ must be an object of strings");
            for (const auto& m : member.value.object) {
                if (!m.value.is_string())
                    throw fail("__metadata__ value of " + json::quote(m.key) + " must be a string");
                metadata[m.key] = m.value.string;
            }
            continue;
        }
        TensorInfo t;
        try {
            t = parse_tensor_entry(member.key, member.value);
        } catch (const Error& e) {
            throw fail(e.what());
        }
        if (t.data_end > buffer_size)
            throw fail("tensor " + json::quote(t.name) + ": data_offsets [" +
                       std::to_string(t.data_begin) + ", " + std::to_string(t.data_end) +
                       "] run past the end of the " + std::to_string(buffer_size) +
                       "-byte data buffer (file truncated?)");
        tensors.push_back(std::move(t));
    }
}

// Puts `tensors` in data order and checks that their ranges tile the data buffer: no overlap
// (two tensors sharing bytes), no holes (bytes no tensor claims), nothing left over at the end.
void sort_and_check_tiling(std::vector<TensorInfo>& tensors, uint64_t buffer_size,
                           const std::string& path) {
    const auto fail = [&](const std::string& what) { return file_error(path, what); };
    std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
        return a.data_begin != b.data_begin ? a.data_begin < b.data_begin : a.data_end < b.data_end;
    });
    std::size_t covered = 0;
    const TensorInfo* previous = nullptr;
    for (const auto& t : tensors) {
        if (t.data_begin < covered)
            throw fail("tensors " + json::quote(previous->name) + " and " + json::quote(t.name) +
                       " overlap in the data buffer (bytes " + std::to_string(t.data_begin) +
                       " to " + std::to_string(covered) + ")");
        if (t.data_begin > covered)
            throw fail("bytes " + std::to_string(covered) + " to " + std::to_string(t.data_begin) +
                       " of the data buffer belong to no tensor");
        covered = t.data_end;
        previous = &t;
    }
    if (covered != buffer_size)
        throw fail("the data buffer holds " + std::to_string(buffer_size) +
                   " bytes but the tensors cover only " + std::to_string(covered) +
                   " (trailing bytes after the last tensor)");
}

}  // namespace

std::string shape_string(std::span<const int64_t> shape) {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) {
        if (i) s += ", ";
        s += std::to_string(shape[i]);
    }
    return s + "]";
}

std::string_view safetensors_name(DType dtype) {
    for (const auto& e : kDtypes)
        if (e.dtype == dtype) return e.name;
    return "?";
}

// ---------------------------------------------------------------------------------------------
// Reader

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept {
    *this = std::move(other);
}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
    if (this != &other) {
        if (fd_ >= 0) ::close(fd_);
        path_ = std::move(other.path_);
        fd_ = std::exchange(other.fd_, -1);
        data_start_ = other.data_start_;
        tensors_ = std::move(other.tensors_);
        index_ = std::move(other.index_);
        metadata_ = std::move(other.metadata_);
        header_sha256_ = std::move(other.header_sha256_);
        bytes_read_ = other.bytes_read_;
    }
    return *this;
}

SafetensorsFile::~SafetensorsFile() {
    if (fd_ >= 0) ::close(fd_);
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
    SafetensorsFile file;
    file.path_ = path;
    const auto fail = [&](const std::string& what) { return file_error(path, what); };

    file.fd_ = open_regular(path);  // a FIFO or a device is refused here, never waited on
    struct stat st {};
    if (::fstat(file.fd_, &st) != 0) throw fail("cannot stat: " + errno_text(errno));
    const auto file_size = static_cast<uint64_t>(st.st_size);
    if (file_size < 8)
        throw fail("file is " + std::to_string(file_size) +
                   " bytes, too short for a safetensors header (is this a safetensors file?)");

    const RawHeader header = read_raw_header(file.fd_, path, file_size);
    file.data_start_ = 8 + static_cast<std::size_t>(header.size);
    file.bytes_read_ = file.data_start_;
    file.header_sha256_ = header.sha256;
    const uint64_t buffer_size = file_size - 8 - header.size;

    json::Value root;
    try {
        root = json::parse(header.text);
    } catch (const Error& e) {
        throw fail(std::string("invalid header JSON: ") + e.what());
    }
    if (!root.is_object())
        throw fail(std::string("header must be a JSON object, got a ") +
                   json::kind_name(root.kind));
    read_members(root, buffer_size, path, file.metadata_, file.tensors_);
    sort_and_check_tiling(file.tensors_, buffer_size, path);
    for (std::size_t i = 0; i < file.tensors_.size(); ++i) file.index_[file.tensors_[i].name] = i;
    return file;
}

std::vector<std::string> SafetensorsFile::names() const {
    std::vector<std::string> out;
    out.reserve(tensors_.size());
    for (const auto& t : tensors_) out.push_back(t.name);
    return out;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
    const auto it = index_.find(name);
    return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::vector<float> SafetensorsFile::read_f32(std::string_view name) const {
    const TensorInfo* t = find(name);
    if (!t) throw Error(path_ + ": no tensor named " + json::quote(name));
    std::vector<float> out(t->numel);
    read_f32(*t, out);
    return out;
}

void SafetensorsFile::read_f32(const TensorInfo& tensor, std::span<float> out) const {
    const std::string where = path_ + ": tensor " + json::quote(tensor.name);
    if (out.size() != tensor.numel)
        throw Error(where + " has " + std::to_string(tensor.numel) + " elements, the buffer " +
                    std::to_string(out.size()));
    std::string why;
    const uint64_t offset = data_start_ + tensor.data_begin;
    if (tensor.dtype == DType::f32) {
        if (!pread_all(fd_, out.data(), out.size_bytes(), offset, &why))
            throw Error(where + ": cannot read: " + why);
        bytes_read_ += out.size_bytes();
        return;
    }
    if (tensor.dtype != DType::f16 && tensor.dtype != DType::bf16)
        throw Error(where + " has dtype " + std::string(safetensors_name(tensor.dtype)) +
                    "; only F32, F16 and BF16 can be read as float");
    // 16-bit values: read a chunk, widen it, repeat.
    constexpr std::size_t kChunk = 1 << 16;
    std::vector<uint16_t> raw(std::min(kChunk, out.size()));
    for (std::size_t done = 0; done < out.size();) {
        const std::size_t n = std::min(kChunk, out.size() - done);
        if (!pread_all(fd_, raw.data(), n * 2, offset + done * 2, &why))
            throw Error(where + ": cannot read: " + why);
        kernels::widen(out.data() + done, kernels::ConstPtr(raw.data(), tensor.dtype), n);
        bytes_read_ += n * 2;
        done += n;
    }
}

void SafetensorsFile::read_raw(const TensorInfo& tensor, std::span<char> out) const {
    const std::string where = path_ + ": tensor " + json::quote(tensor.name);
    if (out.size() != tensor.data_end - tensor.data_begin)
        throw Error(where + " has " + std::to_string(tensor.data_end - tensor.data_begin) +
                    " bytes, the buffer " + std::to_string(out.size()));
    std::string why;
    if (!pread_all(fd_, out.data(), out.size(), data_start_ + tensor.data_begin, &why))
        throw Error(where + ": cannot read: " + why);
    bytes_read_ += out.size();
}

// ---------------------------------------------------------------------------------------------
// Writer

namespace {

// The file being written under a temporary name (output_file.h's ReplacingFile: removed
// unless committed, a device or FIFO at the target refused), hashed as it goes.
class HashedFile {
public:
    explicit HashedFile(const std::string& target) : file_(target) {}

    // Writes and hashes; the first `header_bytes` also go into the header's hash.
    void write(const void* data, std::size_t size) {
        hash_.update(data, size);
        if (header_left_ > 0) {
            const std::size_t n = std::min(header_left_, size);
            header_hash_.update(data, n);
            header_left_ -= n;
        }
        file_.write(data, size);
    }

    void hash_header(std::size_t bytes) { header_left_ = bytes; }
    WrittenFile written() {
        return WrittenFile{file_.size(), hash_.hex_digest(), header_hash_.hex_digest()};
    }

    // Flushes to disk and renames over the target, so readers see the old file or the new one.
    void commit() { file_.commit(); }

private:
    ReplacingFile file_;
    Sha256 hash_, header_hash_;
    std::size_t header_left_ = 0;
};

}  // namespace

WrittenFile write_safetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                              const std::map<std::string, std::string>& metadata) {
    std::vector<std::size_t> order(tensors.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return tensors[a].name < tensors[b].name; });

    std::string header = "{";
    if (!metadata.empty()) {
        header += "\"__metadata__\":{";
        bool first = true;
        for (const auto& [key, value] : metadata) {
            if (!first) header += ',';
            header += json::quote(key) + ":" + json::quote(value);
            first = false;
        }
        header += "}";
    }
    std::vector<std::size_t> sizes(tensors.size());  // bytes of each tensor
    std::size_t offset = 0;
    for (std::size_t k = 0; k < order.size(); ++k) {
        const TensorToWrite& t = tensors[order[k]];
        const std::string where = path + ": tensor " + json::quote(t.name);
        if (t.name.empty() || t.name == "__metadata__")
            throw Error(where + ": invalid tensor name");
        if (k > 0 && tensors[order[k - 1]].name == t.name) throw Error(where + " appears twice");
        std::size_t numel = 1;
        std::string shape = "[";
        for (std::size_t i = 0; i < t.shape.size(); ++i) {
            if (t.shape[i] < 0) throw Error(where + ": negative dimension");
            numel *= static_cast<std::size_t>(t.shape[i]);
            if (i) shape += ',';
            shape += std::to_string(t.shape[i]);
        }
        shape += "]";
        if (numel > 0 && !t.data) throw Error(where + ": no data");
        if (!kernels::is_compute_type(t.dtype))
            throw Error(where + ": cannot write dtype " + std::string(safetensors_name(t.dtype)));
        sizes[order[k]] = numel * kernels::size_of(t.dtype);
        const std::size_t end = offset + sizes[order[k]];
        if (header.size() > 1) header += ',';
        header += json::quote(t.name) + ":{\"dtype\":\"" + std::string(safetensors_name(t.dtype)) +
                  "\",\"shape\":" + shape + ",\"data_offsets\":[" + std::to_string(offset) + "," +
                  std::to_string(end) + "]}";
        offset = end;
    }
    header += "}";
    header.append((8 - header.size() % 8) % 8, ' ');  // aligns the data buffer to 8 bytes

    HashedFile out(path);
    out.hash_header(8 + header.size());
    unsigned char length_bytes[8];
    uint64_t n = header.size();
    for (auto& b : length_bytes) {
        b = static_cast<unsigned char>(n & 0xFF);
        n >>= 8;
    }
    out.write(length_bytes, 8);
    out.write(header.data(), header.size());
    for (const std::size_t i : order) out.write(tensors[i].data, sizes[i]);  // bytes
    WrittenFile written = out.written();
    out.commit();
    return written;
}

}  // namespace trident::io
