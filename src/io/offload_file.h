// A scratch file of one rank in optimizer.offload_dir (ZeRO-Infinity's NVMe offload,
// Rajbhandari et al., arXiv 2104.07857) and the I/O thread that reads and writes it: what the
// optimizer state's store (optim/offload_store.h) and ZeRO-3's offloaded parameter shard
// (data_parallel/param_file.h) share.
//
// The file is created, locked (flock: two runs on one directory would overwrite each other's)
// and its blocks reserved (posix_fallocate, reading as zeros) as it is made, so a full disk is
// found then; it is removed when the object goes, being scratch. Reads and writes are posted
// to one queue run in order by one thread (pread/pwrite of a whole range each), so a read
// posted after a write of the same bytes sees them. A transfer that fails (an I/O error, a
// fault of io/fault_injection.h) or a file removed under the run is an OffloadError naming
// the directory and the file; after a failure the queue passes over the rest until the error
// is taken.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "kernels/error.h"

namespace trident::io {

// An offload file's directory cannot take it, or the file could not be made, read or written
// (or is gone); or an offload's host memory cannot be had (optim/host_store.h).
class OffloadError : public Error {
public:
    using Error::Error;
};

// Whether `dir` is there, a directory and writable, with room for `bytes` more: throws
// OffloadError naming optimizer.offload_dir and the path where not (`needs` says what the
// bytes are for, with its verb: "this rank's optimizer state needs").
void check_offload_dir(const std::string& dir, std::uint64_t bytes,
                       const std::string& needs = "this rank's optimizer state needs");

class OffloadFile {
public:
    // <dir>/<name>, of `bytes` reserved; `room` bytes (at least `bytes`) must be free in
    // `dir`, described as `needs` (check_offload_dir).
    OffloadFile(const std::string& dir, const std::string& name, std::uint64_t bytes,
                std::uint64_t room, const std::string& needs);
    ~OffloadFile();
    OffloadFile(const OffloadFile&) = delete;
    OffloadFile& operator=(const OffloadFile&) = delete;

    // Queues a read of `bytes` at byte `at` into `to` (or a write from `from`); returns the
    // transfer's sequence number. The memory must stay until wait() has seen it done.
    std::uint64_t post_read(void* to, std::size_t bytes, std::uint64_t at);
    std::uint64_t post_write(const void* from, std::size_t bytes, std::uint64_t at);
    // Until the transfer `seq` (and every one before it) is done.
    void wait(std::uint64_t seq);
    void wait_all() { wait(posted_); }
    // Whether a transfer has failed (and the failure is not yet taken).
    bool failed();
    // After wait_all: throws the first failure since the last call, if any, and clears it.
    void throw_failure();
    // Throws OffloadError if the file was removed (or replaced) under the run.
    void check_still_there() const;

    // Bytes moved between the file and memory since it was made.
    std::uint64_t bytes_read() const { return bytes_read_; }
    std::uint64_t bytes_written() const { return bytes_written_; }
    const std::string& path() const { return path_; }

private:
    struct Job {
        bool write;
        char* memory;
        std::size_t bytes;
        std::uint64_t at;
    };
    std::uint64_t post(const Job& job);
    void run_io();                  // the I/O thread
    void transfer(const Job& job);  // one pread or pwrite of the whole range

    std::string dir_, path_;
    int fd_ = -1;

    std::mutex mutex_;
    std::condition_variable changed_;
    std::deque<std::pair<std::uint64_t, Job>> queue_;
    std::uint64_t posted_ = 0, done_ = 0;
    std::string error_;  // the first failed transfer's, until throw_failure reports it
    bool stopping_ = false;
    std::atomic<std::uint64_t> bytes_read_ = 0, bytes_written_ = 0;
    std::thread io_;
};

}  // namespace trident::io
