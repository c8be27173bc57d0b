// Plain, gzip and zstd files as byte streams (see byte_source.h).
#include "data/byte_source.h"

#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "io/input_file.h"
#include "io/output_file.h"
#include "kernels/error.h"

namespace trident::data {

namespace {

constexpr std::size_t kReadBytes = std::size_t{1} << 20;

bool ends_with(const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The file's bytes as they are, read in pieces.
class RawFile {
public:
    explicit RawFile(const std::string& path) : path_(path), fd_(io::open_regular(path)) {}
    ~RawFile() { ::close(fd_); }
    RawFile(const RawFile&) = delete;
    RawFile& operator=(const RawFile&) = delete;

    std::size_t read(char* out, std::size_t size) {
        for (;;) {
            const ssize_t got = ::read(fd_, out, size);
            if (got >= 0) {
                consumed_ += static_cast<uint64_t>(got);
                return static_cast<std::size_t>(got);
            }
            if (errno != EINTR) throw Error(path_ + ": cannot read: " + io::errno_text(errno));
        }
    }
    uint64_t consumed() const { return consumed_; }
    const std::string& path() const { return path_; }

private:
    std::string path_;
    int fd_;
    uint64_t consumed_ = 0;
};

class PlainSource : public ByteSource {
public:
    explicit PlainSource(const std::string& path) : file_(path) {}
    std::size_t read(std::span<char> out) override {
        std::size_t filled = 0;
        while (filled < out.size()) {
            const std::size_t got = file_.read(out.data() + filled, out.size() - filled);
            if (got == 0) break;
            filled += got;
        }
        return filled;
    }
    uint64_t consumed() const override { return file_.consumed(); }

private:
    RawFile file_;
};

// The compressed bytes read so far and not yet decompressed, shared by both decompressors.
class Compressed {
public:
    explicit Compressed(const std::string& path) : file_(path), buffer_(kReadBytes) {}

    // More input when all is used; false at the file's end.
    bool refill() {
        if (at_ < size_) return true;
        size_ = file_.read(buffer_.data(), buffer_.size());
        at_ = 0;
        return size_ > 0;
    }
    // The first bytes must be `magic`: a file named .gz or .zst that is not is named so.
    void expect(std::span<const unsigned char> magic, const std::string& what,
                const std::string& extension) {
        refill();
        if (size_ < magic.size() ||
            !std::equal(magic.begin(), magic.end(),
                        reinterpret_cast<const unsigned char*>(buffer_.data())))
            throw Error(file_.path() + ": not " + what + " data (its name ends in " + extension +
                        "; its first bytes say otherwise)");
    }
    const unsigned char* next() const {
        return reinterpret_cast<const unsigned char*>(buffer_.data()) + at_;
    }
    std::size_t left() const { return size_ - at_; }
    void used(std::size_t n) { at_ += n; }
    uint64_t consumed() const { return file_.consumed(); }
    const std::string& path() const { return file_.path(); }

private:
    RawFile file_;
    std::vector<char> buffer_;
    std::size_t at_ = 0, size_ = 0;
};

class GzipSource : public ByteSource {
public:
    explicit GzipSource(const std::string& path) : in_(path) {
        static constexpr unsigned char kMagic[] = {0x1f, 0x8b};
        in_.expect(kMagic, "gzip", ".gz");
        // 15 + 16: a gzip header and trailer, a window of up to 32 KiB.
        if (inflateInit2(&z_, 15 + 16) != Z_OK) throw Error(path + ": zlib cannot start");
    }
    ~GzipSource() override { inflateEnd(&z_); }

    std::size_t read(std::span<char> out) override {
        z_.next_out = reinterpret_cast<Bytef*>(out.data());
        z_.avail_out = static_cast<uInt>(out.size());
        while (z_.avail_out > 0) {
            if (!in_.refill()) {
                if (inside_) throw Error(in_.path() + ": cut short inside its gzip data");
                break;
            }
            z_.next_in = const_cast<Bytef*>(in_.next());
            z_.avail_in = static_cast<uInt>(in_.left());
            const int rc = inflate(&z_, Z_NO_FLUSH);
            in_.used(in_.left() - z_.avail_in);
            inside_ = rc != Z_STREAM_END;
            if (rc == Z_STREAM_END) {
                inflateReset(&z_);  // another member may follow
            } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
                throw Error(in_.path() + ": corrupt gzip data (zlib: " +
                            (z_.msg ? z_.msg : "error " + std::to_string(rc)) + ")");
            }
        }
        return out.size() - z_.avail_out;
    }
    uint64_t consumed() const override { return in_.consumed(); }

private:
    Compressed in_;
    z_stream z_{};
    bool inside_ = false;  // a member begun and not ended
};

class ZstdSource : public ByteSource {
public:
    explicit ZstdSource(const std::string& path) : in_(path) {
        static constexpr unsigned char kMagic[] = {0x28, 0xb5, 0x2f, 0xfd};
        in_.expect(kMagic, "zstd", ".zst");
        // After the check: a constructor that throws runs no destructor to free the stream.
        z_ = ZSTD_createDStream();
        if (!z_) throw Error(path + ": libzstd cannot start");
    }
    ~ZstdSource() override { ZSTD_freeDStream(z_); }

    std::size_t read(std::span<char> out) override {
        ZSTD_outBuffer output{out.data(), out.size(), 0};
        while (output.pos < output.size) {
            if (!in_.refill()) {
                if (inside_) throw Error(in_.path() + ": cut short inside its zstd data");
                break;
            }
            ZSTD_inBuffer input{in_.next(), in_.left(), 0};
            const std::size_t rc = ZSTD_decompressStream(z_, &output, &input);
            in_.used(input.pos);
            if (ZSTD_isError(rc))
                throw Error(in_.path() + ": corrupt zstd data (libzstd: " + ZSTD_getErrorName(rc) +
                            ")");
            inside_ = rc != 0;  // 0: a frame ended; another may follow
        }
        return output.pos;
    }
    uint64_t consumed() const override { return in_.consumed(); }

private:
    Compressed in_;
    ZSTD_DStream* z_ = nullptr;
    bool inside_ = false;
};

}  // namespace

Compression compression_of(const std::string& path) {
    if (ends_with(path, ".gz")) return Compression::gzip;
    if (ends_with(path, ".zst")) return Compression::zstd;
    return Compression::none;
}

std::unique_ptr<ByteSource> open_byte_source(const std::string& path) {
    switch (compression_of(path)) {
        case Compression::gzip:
            return std::make_unique<GzipSource>(path);
        case Compression::zstd:
            return std::make_unique<ZstdSource>(path);
        case Compression::none:
            break;
    }
    return std::make_unique<PlainSource>(path);
}

}  // namespace trident::data
