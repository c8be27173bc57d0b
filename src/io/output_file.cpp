// Written files with every failure named (see output_file.h).
#include "io/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "io/fault_injection.h"
#include "io/input_file.h"
#include "io/user_paths.h"
#include "kernels/error.h"

namespace trident::io {

std::string errno_text(int error) {
    const char* name = strerrorname_np(error);
    return std::string(std::strerror(error)) + " (" +
           (name ? std::string(name) : "errno " + std::to_string(error)) + ")";
}

OutputFile::OutputFile(std::string path, Mode mode, std::string name)
    : path_(std::move(path)), name_(name.empty() ? path_ : std::move(name)) {
    // A device, FIFO or socket is refused before it is opened (a FIFO would block, a device
    // be fed), and again after, should one have taken the name in between: without
    // O_NONBLOCK the open of a FIFO would wait for a reader before anything could be checked.
    refuse_special_file(path_);
    const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK | O_NOCTTY |
                      (mode == Mode::append ? O_APPEND : 0);
    fd_ = ::open(path_.c_str(), flags, 0644);
    if (fd_ < 0) throw Error(name_ + ": cannot create: " + errno_text(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
        const std::string kind = file_kind(st.st_mode);
        ::close(fd_);
        fd_ = -1;
        throw Error(name_ + ": is " + kind + ", not a regular file: it is not written over");
    }
    // Cut only now that it is known to be a regular file.
    if (mode == Mode::create && ::ftruncate(fd_, 0) != 0) {
        const int error = errno;
        ::close(fd_);
        fd_ = -1;
        throw Error(name_ + ": cannot create: " + errno_text(error));
    }
    if (mode == Mode::append) size_ = static_cast<uint64_t>(st.st_size);
}

OutputFile::~OutputFile() {
    if (fd_ >= 0) ::close(fd_);
}

void OutputFile::write(const void* data, std::size_t size) {
    const auto* p = static_cast<const char*>(data);
    // A test fault: half of the bytes land, then the disk is "full".
    if (const int fault = fault::write_error(path_)) {
        const std::size_t half = size / 2;
        if (half > 0 && ::write(fd_, p, half) > 0) size_ += half;
        throw Error(name_ + ": cannot write: " + errno_text(fault));
    }
    while (size > 0) {
        const ssize_t put = ::write(fd_, p, size);
        if (put < 0) {
            if (errno == EINTR) continue;
            throw Error(name_ + ": cannot write: " + errno_text(errno));
        }
        p += put;
        size -= static_cast<std::size_t>(put);
        size_ += static_cast<uint64_t>(put);
    }
}

void OutputFile::write_at(uint64_t offset, const void* data, std::size_t size) {
    if (offset + size > size_)
        throw Error(name_ + ": internal: a write at byte " + std::to_string(offset) +
                    " past the end of what was written");
    const auto* p = static_cast<const char*>(data);
    while (size > 0) {
        const ssize_t put = ::pwrite(fd_, p, size, static_cast<off_t>(offset));
        if (put < 0) {
            if (errno == EINTR) continue;
            throw Error(name_ + ": cannot write: " + errno_text(errno));
        }
        p += put;
        offset += static_cast<uint64_t>(put);
        size -= static_cast<std::size_t>(put);
    }
}

void OutputFile::sync() {
    if (::fsync(fd_) != 0) throw Error(name_ + ": cannot sync to disk: " + errno_text(errno));
}

void OutputFile::close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) throw Error(name_ + ": cannot close: " + errno_text(errno));
}

void OutputFile::truncate(uint64_t bytes) {
    // The next write goes where the file now ends (without O_APPEND the offset stays put).
    if (::ftruncate(fd_, static_cast<off_t>(bytes)) != 0 ||
        ::lseek(fd_, static_cast<off_t>(bytes), SEEK_SET) < 0)
        throw Error(name_ + ": cannot cut back to " + std::to_string(bytes) +
                    " bytes: " + errno_text(errno));
    size_ = std::min(size_, bytes);
}

void OutputFile::write_record(std::string_view record) {
    const uint64_t whole = size_;
    try {
        write(record);
    } catch (const Error&) {
        try {
            truncate(whole);
        } catch (const Error&) {  // the first failure is the one to report
        }
        throw;
    }
}

ReplacingFile::ReplacingFile(const std::string& path)
    : path_(path),
      temporary_(temporary_beside(path)),
      file_(temporary_, OutputFile::Mode::create, path) {}

std::string ReplacingFile::temporary_beside(const std::string& path) {
    refuse_special_file(path);  // the rename would replace it
    const std::filesystem::path target(path);
    std::error_code error;
    if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path(), error);
    if (error)
        throw Error(shown(path) + ": cannot make its directory: " + errno_text(error.value()));
    return path + ".tmp." + std::to_string(::getpid());
}

ReplacingFile::~ReplacingFile() {
    if (!committed_) ::unlink(temporary_.c_str());
}

void ReplacingFile::close() {
    if (closed_) return;
    file_.sync();
    file_.close();
    closed_ = true;
}

void ReplacingFile::commit() {
    if (committed_) return;
    close();
    refuse_special_file(path_);  // one that took the name while this file was written
    if (::rename(temporary_.c_str(), path_.c_str()) != 0)
        throw Error(path_ + ": cannot rename " + temporary_ + " into place: " + errno_text(errno));
    committed_ = true;
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
    ReplacingFile out(path);
    out.write(bytes.data(), bytes.size());
    out.commit();
}

void probe_writable_directory(const std::string& dir, const std::string& what) {
    const std::string named = what + ": '" + shown(dir) + "'";
    std::error_code error;
    if (std::filesystem::exists(dir, error) && !std::filesystem::is_directory(dir, error))
        throw Error(named + " is not a directory");
    std::filesystem::create_directories(dir, error);
    if (error) throw Error(named + " cannot be made a directory: " + errno_text(error.value()));
    if (!std::filesystem::is_directory(dir, error)) throw Error(named + " is not a directory");
    const std::string probe =
        (std::filesystem::path(dir) / (".probe_" + std::to_string(::getpid()))).string();
    try {
        OutputFile out(probe);
        out.write("probe\n");
        out.sync();
        out.close();
    } catch (const Error& e) {
        ::unlink(probe.c_str());
        throw Error(named + " is not writable: " + e.what());
    }
    ::unlink(probe.c_str());
}

void sync_path(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error(path + ": cannot open to sync: " + errno_text(errno));
    if (::fsync(fd) != 0) {
        const int error = errno;
        ::close(fd);
        throw Error(path + ": cannot sync to disk: " + errno_text(error));
    }
    ::close(fd);
}

}  // namespace trident::io
