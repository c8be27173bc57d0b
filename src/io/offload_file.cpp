// An offload file and its I/O thread (see offload_file.h).
#include "io/offload_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "io/fault_injection.h"
#include "io/output_file.h"
#include "io/user_paths.h"

namespace trident::io {

namespace {

std::string where(const std::string& dir) {
    return "optimizer.offload_dir '" + dir + "'";
}

}  // namespace

void check_offload_dir(const std::string& dir, std::uint64_t bytes, const std::string& needs) {
    std::error_code error;
    if (!std::filesystem::exists(dir, error))
        throw OffloadError(where(dir) +
                           " does not exist (it is not created: it is meant to be a fast "
                           "local disk, give an existing directory)");
    if (!std::filesystem::is_directory(dir, error))
        throw OffloadError(where(dir) + " is not a directory");
    if (::access(dir.c_str(), W_OK | X_OK) != 0)
        throw OffloadError(where(dir) + " is not writable: " + errno_text(errno));
    struct statvfs fs {};
    if (::statvfs(dir.c_str(), &fs) != 0)
        throw OffloadError(where(dir) + ": cannot read its free space: " + errno_text(errno));
    const std::uint64_t free = static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize;
    if (free < bytes)
        throw OffloadError(where(dir) + " has " + std::to_string(free) + " bytes free; " + needs +
                           " " + std::to_string(bytes));
}

OffloadFile::OffloadFile(const std::string& dir, const std::string& name, std::uint64_t bytes,
                         std::uint64_t room, const std::string& needs)
    : dir_(dir), path_((std::filesystem::path(dir) / name).string()) {
    // A file of an earlier run on this rank is replaced: its room counts as free. Anything
    // else by its name (a device, a FIFO) is refused, never unlinked or written.
    if (const std::string kind = special_kind(path_); !kind.empty())
        throw OffloadError(where(dir) + ": " + path_ + " exists and is " + kind +
                           ", not a regular file: it is not written over; move it away");
    ::unlink(path_.c_str());
    check_offload_dir(dir, std::max(bytes, room), needs);
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd_ < 0)
        throw OffloadError(where(dir) + ": cannot create " + path_ + ": " + errno_text(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
        ::close(fd_);
        throw OffloadError(where(dir) + ": " + path_ + " is in use by another run");
    }
    const int reserved = bytes > 0 ? ::posix_fallocate(fd_, 0, static_cast<off_t>(bytes)) : 0;
    if (reserved != 0) {
        ::close(fd_);
        ::unlink(path_.c_str());
        throw OffloadError(where(dir) + ": cannot reserve " + std::to_string(bytes) +
                           " bytes for " + path_ + ": " + errno_text(reserved));
    }
    io_ = std::thread([this] { run_io(); });
}

OffloadFile::~OffloadFile() {
    {
        const std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
    }
    changed_.notify_all();
    io_.join();
    ::close(fd_);
    ::unlink(path_.c_str());
}

std::uint64_t OffloadFile::post_read(void* to, std::size_t bytes, std::uint64_t at) {
    return post(Job{false, static_cast<char*>(to), bytes, at});
}

std::uint64_t OffloadFile::post_write(const void* from, std::size_t bytes, std::uint64_t at) {
    return post(Job{true, const_cast<char*>(static_cast<const char*>(from)), bytes, at});
}

std::uint64_t OffloadFile::post(const Job& job) {
    std::uint64_t seq;
    {
        const std::lock_guard<std::mutex> lock(mutex_);
        seq = ++posted_;
        queue_.emplace_back(seq, job);
    }
    changed_.notify_all();
    return seq;
}

void OffloadFile::wait(std::uint64_t seq) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return done_ >= seq; });
}

bool OffloadFile::failed() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return !error_.empty();
}

void OffloadFile::throw_failure() {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (error_.empty()) return;
    const std::string error = error_;
    error_.clear();
    throw OffloadError(error);
}

void OffloadFile::run_io() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
        changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, nothing left
        const auto [seq, job] = queue_.front();
        queue_.pop_front();
        const bool failed = !error_.empty();
        lock.unlock();
        std::string error;
        if (!failed) {  // after a failure the rest is passed over
            try {
                transfer(job);
            } catch (const Error& e) {
                error = e.what();
            }
        }
        lock.lock();
        if (!error.empty() && error_.empty()) error_ = error;
        done_ = seq;
        changed_.notify_all();
    }
}

void OffloadFile::transfer(const Job& job) {
    char* p = job.memory;
    std::size_t left = job.bytes;
    auto at = static_cast<off_t>(job.at);
    if (const int fault = job.write ? fault::write_error(path_) : fault::read_error(path_))
        throw OffloadError(where(dir_) + ": cannot " + (job.write ? "write " : "read ") + path_ +
                           ": " + errno_text(fault));
    while (left > 0) {
        const ssize_t moved = job.write ? ::pwrite(fd_, p, left, at) : ::pread(fd_, p, left, at);
        if (moved < 0 && errno == EINTR) continue;
        if (moved <= 0)
            throw OffloadError(where(dir_) + ": cannot " + (job.write ? "write " : "read ") +
                               path_ + ": " +
                               (moved < 0 ? errno_text(errno) : std::string("end of file")));
        p += moved;
        at += moved;
        left -= static_cast<std::size_t>(moved);
        (job.write ? bytes_written_ : bytes_read_) += static_cast<std::uint64_t>(moved);
    }
}

void OffloadFile::check_still_there() const {
    struct stat now {
    }, open{};
    if (::stat(path_.c_str(), &now) != 0 || ::fstat(fd_, &open) != 0 || now.st_ino != open.st_ino ||
        now.st_dev != open.st_dev)
        throw OffloadError(where(dir_) + ": this rank's file " + path_ +
                           " was removed under the run");
}

}  // namespace trident::io
