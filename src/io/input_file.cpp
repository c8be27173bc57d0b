// Opening regular files only, and bounded whole-file reads (see input_file.h).
#include "io/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "io/output_file.h"
#include "kernels/error.h"

namespace trident::io {

const char* file_kind(mode_t mode) {
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISREG(mode)) return "a regular file";
    return "not a file";
}

int open_regular(const std::string& path) {
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) throw Error(path + ": cannot open: " + errno_text(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        const int error = errno;
        ::close(fd);
        throw Error(path + ": cannot stat: " + errno_text(error));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        throw Error(path + ": not a regular file (" + file_kind(st.st_mode) + ")");
    }
    // Reads of a regular file never block anyway; the flag is dropped for what follows.
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

std::string read_regular_file(const std::string& path, uint64_t max_bytes,
                              const std::string& what) {
    const int fd = open_regular(path);
    std::string text;
    try {
        struct stat st {};
        if (::fstat(fd, &st) != 0) throw Error(path + ": cannot stat: " + errno_text(errno));
        const auto size = static_cast<uint64_t>(st.st_size);
        if (size > max_bytes)
            throw Error(path + ": " + std::to_string(size) + " bytes, more than " + what +
                        " may be (" + std::to_string(max_bytes) + " bytes)");
        // Read to the end, which may come later than the size said (a file still growing)
        // but never past the cap.
        char buf[1 << 16];
        while (true) {
            const ssize_t n = ::read(fd, buf, sizeof buf);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) throw Error(path + ": cannot read: " + errno_text(errno));
            if (n == 0) break;
            text.append(buf, static_cast<std::size_t>(n));
            if (text.size() > max_bytes)
                throw Error(path + ": more than " + what + " may be (" + std::to_string(max_bytes) +
                            " bytes)");
        }
    } catch (...) {
        ::close(fd);
        throw;
    }
    ::close(fd);
    return text;
}

}  // namespace trident::io
