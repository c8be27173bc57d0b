// The checkpoint directory's lock (see directory_lock.h).
#include "train/directory_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "io/input_file.h"
#include "io/output_file.h"
#include "io/user_paths.h"
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

DirectoryLock::DirectoryLock(const std::string& dir)
    : path_((std::filesystem::path(dir) / kLockName).string()) {
    const std::string& path = path_;
    io::refuse_special_file(path, "checkpoint.dir");
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0644);
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

bool DirectoryLock::still_held() const {
    struct stat now {
    }, held{};
    return ::stat(path_.c_str(), &now) == 0 && ::fstat(fd_, &held) == 0 &&
           now.st_dev == held.st_dev && now.st_ino == held.st_ino;
}

FileLock::FileLock(const std::string& path, const std::string& what) {
    io::refuse_special_file(path, what);
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NONBLOCK, 0644);
    if (fd_ >= 0) created_ = path;
    if (fd_ < 0 && errno == EEXIST)
        fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0644);
    if (fd_ < 0) throw Error(what + ": " + path + ": cannot create: " + io::errno_text(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) return;
    const int error = errno;
    ::close(fd_);
    fd_ = -1;
    if (error != EWOULDBLOCK)
        throw Error(what + ": " + path + ": cannot lock: " + io::errno_text(error));
    throw Error(what + ": '" + path +
                "' is being written by another run (it holds the file's lock); two runs "
                "appending to one file tear each other's lines: give each run its own " +
                what);
}

FileLock::~FileLock() {
    if (fd_ < 0) return;
    // A file this lock made and nothing wrote (a run stopped before its first line) goes
    // with it: a failed start leaves no file behind.
    struct stat held {
    }, named{};
    if (!created_.empty() && ::fstat(fd_, &held) == 0 && ::stat(created_.c_str(), &named) == 0 &&
        held.st_ino == named.st_ino && held.st_dev == named.st_dev && named.st_size == 0)
        ::unlink(created_.c_str());
    ::close(fd_);  // releases the lock
}

std::unique_ptr<DirectoryLock> claim_checkpoint_dir(const std::string& dir) {
    io::probe_writable_directory(dir, "checkpoint.dir");
    // Where saves put their directories, anything else (a device, a FIFO, a file) would be
    // removed by them: refused instead.
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
        const std::string name = entry.path().filename().string();
        struct stat st {};
        if ((name.starts_with("step_") || name.starts_with(".tmp_step_")) &&
            ::stat(entry.path().c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
            throw Error("checkpoint.dir: '" + entry.path().string() + "' is " +
                        io::file_kind(st.st_mode) +
                        ", not a checkpoint's directory: a save would remove it; move it away");
    }
    return std::make_unique<DirectoryLock>(dir);
}

}  // namespace trident::train
