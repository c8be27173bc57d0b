// Read-only file mappings (see mapped_file.h).
#include "data/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "kernels/error.h"

namespace trident::data {

MappedFile::MappedFile(const std::string& path, const std::string& what) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) throw Error(what + ": cannot open '" + path + "': " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        const int err = errno;
        ::close(fd);
        throw Error(what + ": cannot stat '" + path + "': " + std::strerror(err));
    }
    bytes_ = static_cast<std::size_t>(st.st_size);
    if (bytes_ > 0) {
        base_ = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (base_ == MAP_FAILED) {
            const int err = errno;
            base_ = nullptr;
            ::close(fd);
            throw Error(path + ": cannot map: " + std::strerror(err));
        }
    }
    ::close(fd);
}

MappedFile::~MappedFile() {
    if (base_) ::munmap(base_, bytes_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
    if (this != &other) {
        if (base_) ::munmap(base_, bytes_);
        base_ = std::exchange(other.base_, nullptr);
        bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
}

}  // namespace trident::data
