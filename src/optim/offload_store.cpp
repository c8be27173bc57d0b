// The optimizer state streamed from and to a file (see offload_store.h).
#include "optim/offload_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "io/fault_injection.h"
#include "io/output_file.h"

namespace trident::optim {

namespace {

constexpr int kBuffers = 3;  // read-ahead, update, write-behind
constexpr std::size_t kBytesPerElement = 3 * sizeof(float);

std::string where(const std::string& dir) {
    return "optimizer.offload_dir '" + dir + "'";
}

}  // namespace

void check_offload_dir(const std::string& dir, std::uint64_t bytes) {
    std::error_code error;
    if (!std::filesystem::exists(dir, error))
        throw OffloadError(where(dir) +
                           " does not exist (it is not created: it is meant to be a fast "
                           "local disk, give an existing directory)");
    if (!std::filesystem::is_directory(dir, error))
        throw OffloadError(where(dir) + " is not a directory");
    if (::access(dir.c_str(), W_OK | X_OK) != 0)
        throw OffloadError(where(dir) + " is not writable: " + io::errno_text(errno));
    struct statvfs fs {};
    if (::statvfs(dir.c_str(), &fs) != 0)
        throw OffloadError(where(dir) + ": cannot read its free space: " + io::errno_text(errno));
    const std::uint64_t free = static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize;
    if (free < bytes)
        throw OffloadError(where(dir) + " has " + std::to_string(free) +
                           " bytes free; this rank's optimizer state needs " +
                           std::to_string(bytes));
}

OffloadStore::OffloadStore(const std::string& dir, int rank, std::size_t elements,
                           std::size_t chunk)
    : dir_(dir),
      path_(
          (std::filesystem::path(dir) / ("optimizer_state.rank" + std::to_string(rank))).string()),
      elements_(elements),
      chunk_(std::max<std::size_t>(1, std::min(chunk, elements))),
      chunks_((elements + chunk_ - 1) / chunk_) {
    const std::uint64_t bytes = static_cast<std::uint64_t>(elements) * kBytesPerElement;
    // A file of an earlier run on this rank is replaced: its room counts as free.
    ::unlink(path_.c_str());
    check_offload_dir(dir, bytes);
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd_ < 0)
        throw OffloadError(where(dir) + ": cannot create " + path_ + ": " + io::errno_text(errno));
    // Two runs on one directory would overwrite each other's state.
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
        ::close(fd_);
        throw OffloadError(where(dir) + ": " + path_ + " is in use by another run");
    }
    const int reserved = bytes > 0 ? ::posix_fallocate(fd_, 0, static_cast<off_t>(bytes)) : 0;
    if (reserved != 0) {
        ::close(fd_);
        ::unlink(path_.c_str());
        throw OffloadError(where(dir) + ": cannot reserve " + std::to_string(bytes) +
                           " bytes for " + path_ + ": " + io::errno_text(reserved));
    }
    buffers_.assign(static_cast<std::size_t>(kBuffers) * 3 * chunk_, 0.0f);
    io_ = std::thread([this] { run_io(); });
}

OffloadStore::~OffloadStore() {
    {
        const std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
    }
    changed_.notify_all();
    io_.join();
    ::close(fd_);
    ::unlink(path_.c_str());
}

OffloadStore::Chunk OffloadStore::chunk_at(std::size_t k, int buffer) {
    const std::size_t first = k * chunk_, count = std::min(chunk_, elements_ - first);
    float* base = buffers_.data() + static_cast<std::size_t>(buffer) * 3 * chunk_;
    return Chunk{first, count, base, base + count, base + 2 * count};
}

void OffloadStore::stream(Pass pass, const std::function<void(const Chunk&)>& visit) {
    check_still_there();
    const bool reads = pass != Pass::write, writes = pass != Pass::read;
    std::vector<std::uint64_t> last(kBuffers, 0);  // each buffer's last job
    std::uint64_t read_ahead = reads && chunks_ > 0 ? post({false, 0, 0}) : 0;
    for (std::size_t k = 0; k < chunks_; ++k) {
        const int b = static_cast<int>(k % kBuffers), next = static_cast<int>((k + 1) % kBuffers);
        // The queue runs in order: chunk k-2's write-behind from `next` precedes this read.
        const std::uint64_t this_read = read_ahead;
        if (reads && k + 1 < chunks_) read_ahead = last[next] = post({false, k + 1, next});
        wait(reads ? this_read : last[b]);
        {
            const std::lock_guard<std::mutex> lock(mutex_);
            if (!error_.empty()) break;
        }
        visit(chunk_at(k, b));
        if (writes) last[b] = post({true, k, b});
    }
    wait(posted_);
    const std::lock_guard<std::mutex> lock(mutex_);
    if (!error_.empty()) {
        const std::string error = error_;
        error_.clear();
        throw OffloadError(error);
    }
}

std::uint64_t OffloadStore::post(const Job& job) {
    std::uint64_t seq;
    {
        const std::lock_guard<std::mutex> lock(mutex_);
        seq = ++posted_;
        queue_.emplace_back(seq, job);
    }
    changed_.notify_all();
    return seq;
}

void OffloadStore::wait(std::uint64_t seq) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return done_ >= seq; });
}

void OffloadStore::run_io() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
        changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, nothing left
        const auto [seq, job] = queue_.front();
        queue_.pop_front();
        const bool failed = !error_.empty();
        lock.unlock();
        std::string error;
        if (!failed) {  // after a failure the rest of the stream is passed over
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

void OffloadStore::transfer(const Job& job) {
    const Chunk c = chunk_at(job.chunk, job.buffer);
    auto* p = reinterpret_cast<char*>(c.master);
    std::size_t left = c.count * kBytesPerElement;
    auto at = static_cast<off_t>(c.first * kBytesPerElement);
    if (const int fault = job.write ? io::fault::write_error(path_) : io::fault::read_error(path_))
        throw OffloadError(where(dir_) + ": cannot " + (job.write ? "write " : "read ") + path_ +
                           ": " + io::errno_text(fault));
    while (left > 0) {
        const ssize_t moved = job.write ? ::pwrite(fd_, p, left, at) : ::pread(fd_, p, left, at);
        if (moved < 0 && errno == EINTR) continue;
        if (moved <= 0)
            throw OffloadError(where(dir_) + ": cannot " + (job.write ? "write " : "read ") +
                               path_ + ": " +
                               (moved < 0 ? io::errno_text(errno) : std::string("end of file")));
        p += moved;
        at += moved;
        left -= static_cast<std::size_t>(moved);
        (job.write ? bytes_written_ : bytes_read_) += static_cast<std::uint64_t>(moved);
    }
}

void OffloadStore::check_still_there() const {
    struct stat now {
    }, open{};
    if (::stat(path_.c_str(), &now) != 0 || ::fstat(fd_, &open) != 0 || now.st_ino != open.st_ino ||
        now.st_dev != open.st_dev)
        throw OffloadError(where(dir_) + ": this rank's state file " + path_ +
                           " was removed under the run");
}

}  // namespace trident::optim
