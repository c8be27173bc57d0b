// Sampled file fingerprints (see fingerprint.h).
#include "io/fingerprint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "io/input_file.h"
#include "io/output_file.h"
#include "io/sha256.h"
#include "kernels/error.h"

namespace trident::io {

Fingerprint fingerprint_file(const std::string& path) {
    const int fd = open_regular(path);
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        const int error = errno;
        ::close(fd);
        throw Error(path + ": cannot stat: " + errno_text(error));
    }
    Fingerprint f;
    f.bytes = static_cast<uint64_t>(st.st_size);
    Sha256 sha;
    uint8_t size_bytes[8];
    for (int i = 0; i < 8; ++i) size_bytes[i] = static_cast<uint8_t>(f.bytes >> (8 * i));
    sha.update(size_bytes, sizeof size_bytes);

    // Block k starts at k/(n-1) of the way to the last block's start: the first and the last
    // bytes are always in the sample.
    const uint64_t whole = kSampleBlocks * kBlockBytes;
    const uint64_t blocks = f.bytes <= whole ? 1 : kSampleBlocks;
    const uint64_t length = f.bytes <= whole ? f.bytes : kBlockBytes;
    std::vector<char> buffer(static_cast<std::size_t>(length));
    for (uint64_t k = 0; k < blocks; ++k) {
        const uint64_t offset = blocks == 1 ? 0 : k * (f.bytes - length) / (blocks - 1);
        std::size_t done = 0;
        while (done < buffer.size()) {
            const ssize_t got = ::pread(fd, buffer.data() + done, buffer.size() - done,
                                        static_cast<off_t>(offset + done));
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0) {
                const int error = got < 0 ? errno : 0;
                ::close(fd);
                throw Error(path + ": cannot read: " +
                            (error ? errno_text(error) : "the file ended early"));
            }
            done += static_cast<std::size_t>(got);
        }
        sha.update(buffer.data(), buffer.size());
    }
    ::close(fd);
    f.sampled_sha256 = sha.hex_digest();
    return f;
}

}  // namespace trident::io
