// This rank's optimizer state in a file (optimizer.offload: nvme; ZeRO-Infinity's NVMe
// offload, Rajbhandari et al., arXiv 2104.07857): the fp32 master weights and Adam's moments
// of what it owns, streamed through three host buffers a chunk at a time so that only those
// buffers are resident. An I/O thread reads chunk k+1 ahead and writes chunk k-1 behind while
// the caller updates chunk k (pread/pwrite, in order: one queue, one thread).
//
// The file, <offload_dir>/optimizer_state.rank<R>, holds the chunks one after another, each
// as its master weights, then m, then v (count floats each): chunk k of `chunk` elements
// starts at byte 12·chunk·k, so one read and one write move a chunk. Its blocks are reserved
// as the run starts (posix_fallocate, reading as zeros: Adam's moments before the first
// step), so a full disk is found then; a write that fails later anyway (an I/O error) or a
// file removed under the run ends the step with an OffloadError naming the directory.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernels/error.h"
#include "optim/state_store.h"

namespace trident::optim {

// Whether `dir` is there, a directory and writable, with room for `bytes` more: throws
// OffloadError naming optimizer.offload_dir and the path where not. A run checks it as it
// starts (where every rank agrees on the verdict), and each rank's store again for its own
// state.
void check_offload_dir(const std::string& dir, std::uint64_t bytes);

class OffloadStore final : public StateStore {
public:
    // Checks `dir` (there, a directory, writable, with room for 12·elements bytes: messages
    // name optimizer.offload_dir and the path), then creates and reserves this rank's file.
    OffloadStore(const std::string& dir, int rank, std::size_t elements, std::size_t chunk);
    ~OffloadStore();  // the file is removed: it is scratch, a checkpoint keeps the state
    OffloadStore(const OffloadStore&) = delete;
    OffloadStore& operator=(const OffloadStore&) = delete;

    // Each chunk (StateStore::stream) through a host buffer of the store. Throws OffloadError
    // where the file cannot be read or written or is no longer there.
    void stream(Pass pass, const std::function<void(const Chunk&)>& visit) override;

    // Bytes moved between the file and the buffers since the store was made.
    std::uint64_t bytes_read() const { return bytes_read_; }
    std::uint64_t bytes_written() const { return bytes_written_; }
    // Host memory the chunk buffers take.
    std::size_t buffer_bytes() const { return buffers_.size() * sizeof(float); }
    const std::string& path() const { return path_; }
    std::size_t chunk() const override { return chunk_; }

private:
    struct Job {
        bool write;
        std::size_t chunk;
        int buffer;
    };
    Chunk chunk_at(std::size_t k, int buffer);
    std::uint64_t post(const Job& job);  // returns its sequence number
    void wait(std::uint64_t seq);        // until the job `seq` is done
    void run_io();                       // the I/O thread
    void transfer(const Job& job);       // one pread or pwrite of a whole chunk
    void check_still_there() const;

    std::string dir_, path_;
    int fd_ = -1;
    std::size_t elements_, chunk_, chunks_;
    std::vector<float> buffers_;  // 3 buffers of 3·chunk floats

    std::mutex mutex_;
    std::condition_variable changed_;
    std::deque<std::pair<std::uint64_t, Job>> queue_;
    std::uint64_t posted_ = 0, done_ = 0;
    std::string error_;  // the first failed transfer's, until stream reports it
    bool stopping_ = false;
    std::atomic<std::uint64_t> bytes_read_ = 0, bytes_written_ = 0;
    std::thread io_;
};

}  // namespace trident::optim
