// Read-only file mappings (see mapped_file.h).
#include "data/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <mutex>
#include <utility>

#include "io/input_file.h"
#include "kernels/error.h"

namespace trident::data {

namespace {

// The mappings the SIGBUS handler knows, each with its message written out beforehand (the
// handler may only call async-signal-safe functions: it reads this table and write(2)s).
struct Watched {
    std::atomic<const char*> begin{nullptr};
    std::atomic<const char*> end{nullptr};
    char message[1024] = {};
    std::size_t length = 0;
};
constexpr int kWatched = 256;
Watched g_watched[kWatched];
std::mutex g_watched_mutex;  // for registering, never taken by the handler

void on_sigbus(int signal, siginfo_t* info, void*) {
    const char* at = static_cast<const char*>(info->si_addr);
    for (const Watched& w : g_watched) {
        const char* begin = w.begin.load(std::memory_order_acquire);
        if (begin && at >= begin && at < w.end.load(std::memory_order_acquire)) {
            ssize_t ignored = ::write(STDERR_FILENO, w.message, w.length);
            (void)ignored;
            ::_exit(1);
        }
    }
    // Not a dataset's page: the default action, as if no handler were installed.
    ::signal(signal, SIG_DFL);
    ::raise(signal);
}

int watch(const void* base, std::size_t bytes, const std::string& path, const std::string& what) {
    static const bool installed = [] {
        struct sigaction action {};
        action.sa_sigaction = on_sigbus;
        action.sa_flags = SA_SIGINFO;
        sigemptyset(&action.sa_mask);
        return ::sigaction(SIGBUS, &action, nullptr) == 0;
    }();
    if (!installed) return -1;
    const std::string line = "trident: error: " + what + ": " + path +
                             ": the file changed while this run read it (truncated or "
                             "rewritten in place: a read past its new end); restore it and "
                             "resume from the last checkpoint\n";
    const std::lock_guard lock(g_watched_mutex);
    for (int i = 0; i < kWatched; ++i) {
        Watched& w = g_watched[i];
        if (w.begin.load()) continue;
        w.length = std::min(line.size(), sizeof w.message);
        std::memcpy(w.message, line.data(), w.length);
        w.end.store(static_cast<const char*>(base) + bytes, std::memory_order_release);
        w.begin.store(static_cast<const char*>(base), std::memory_order_release);
        return i;
    }
    return -1;  // more mappings than the table holds: those go unwatched
}

void unwatch(int slot) {
    if (slot < 0) return;
    const std::lock_guard lock(g_watched_mutex);
    g_watched[slot].begin.store(nullptr, std::memory_order_release);
}

}  // namespace

MappedFile::MappedFile(const std::string& path, const std::string& what) {
    int fd = -1;
    try {
        fd = io::open_regular(path);  // a FIFO or a device is no dataset
    } catch (const Error& e) {
        throw Error(what + ": " + e.what());
    }
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
        slot_ = watch(base_, bytes_, path, what);
    }
    ::close(fd);
}

MappedFile::~MappedFile() {
    unwatch(slot_);
    if (base_) ::munmap(base_, bytes_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      slot_(std::exchange(other.slot_, -1)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
    if (this != &other) {
        unwatch(slot_);
        if (base_) ::munmap(base_, bytes_);
        base_ = std::exchange(other.base_, nullptr);
        bytes_ = std::exchange(other.bytes_, 0);
        slot_ = std::exchange(other.slot_, -1);
    }
    return *this;
}

}  // namespace trident::data
