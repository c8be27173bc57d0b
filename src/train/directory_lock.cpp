// The checkpoint directory's lock (see directory_lock.h).
#include "train/directory_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "io/output_file.h"
#include "kernels/error.h"

namespace trident::train {

namespace {

constexpr const char* kLockName = ".lock";

std::string host_name() {
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0) return "unknown host";
    return host;
}

// What the holder wrote into the lock file: "host H, pid P" (bounded, one line).
std::string holder_of(int fd) {
    char text[256] = {};
    const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
    std::string holder(text, n > 0 ? static_cast<std::size_t>(n) : 0);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
    return holder.empty() || holder.find('\n') != std::string::npos ? "holder unknown" : holder;
}

}  // namespace

DirectoryLock::DirectoryLock(const std::string& dir) {
    const std::string path = (std::filesystem::path(dir) / kLockName).string();
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0)
        throw Error("checkpoint.dir: " + path + ": cannot create: " + io::errno_text(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
        const int error = errno;
        const std::string holder = holder_of(fd_);
        ::close(fd_);
        fd_ = -1;
        if (error != EWOULDBLOCK)
            throw Error("checkpoint.dir: " + path + ": cannot lock: " + io::errno_text(error));
        throw Error("checkpoint.dir: '" + dir + "' is in use by another run (" + holder +
                    "); two runs on one directory would delete each other's checkpoints: wait "
                    "for it to end, or choose another checkpoint.dir");
    }
    const std::string holder = "host " + host_name() + ", pid " + std::to_string(::getpid());
    // Best effort: the lock holds without the text, which only makes the message clearer.
    const bool recorded =
        ::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, holder.data(), holder.size(), 0) >= 0;
    (void)recorded;
}

DirectoryLock::~DirectoryLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
}

std::unique_ptr<DirectoryLock> claim_checkpoint_dir(const std::string& dir) {
    io::probe_writable_directory(dir, "checkpoint.dir");
    return std::make_unique<DirectoryLock>(dir);
}

}  // namespace trident::train
