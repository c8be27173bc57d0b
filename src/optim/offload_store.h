// This rank's optimizer state in a file (optimizer.offload: nvme; ZeRO-Infinity's NVMe
// offload, Rajbhandari et al., arXiv 2104.07857): the fp32 master weights and the optimizer's
// state arrays of what it owns, streamed through three host buffers a chunk at a time so that
// only those buffers are resident. An I/O thread reads chunk k+1 ahead and writes chunk k-1 behind
// while the caller updates chunk k (pread/pwrite, in order: one queue, one thread).
//
// The file, <offload_dir>/optimizer_state.rank<R>, holds the chunks one after another, each
// as its arrays (count floats each; AdamW: master weights, m, v): chunk k of `chunk` elements
// starts at byte 4·arrays·chunk·k, so one read and one write move a chunk. Its blocks are
// reserved as the run starts (posix_fallocate, reading as zeros: the state before the first
// step), so a full disk is found then; a write that fails later anyway (an I/O error) or a
// file removed under the run ends the step with an OffloadError naming the directory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/offload_file.h"
#include "optim/state_store.h"

namespace trident::optim {

// The start-up check of the directory (io/offload_file.h).
using io::check_offload_dir;

class OffloadStore final : public StateStore {
public:
    // Checks `dir` (there, a directory, writable, with room for 4·arrays·elements bytes:
    // messages name optimizer.offload_dir and the path), then creates and reserves this rank's
    // file; removed with the store (scratch: a checkpoint keeps the state).
    OffloadStore(const std::string& dir, int rank, std::size_t elements, std::size_t arrays,
                 std::size_t chunk);
    OffloadStore(const OffloadStore&) = delete;
    OffloadStore& operator=(const OffloadStore&) = delete;

    // Each chunk (StateStore::stream) through a host buffer of the store. Throws OffloadError
    // where the file cannot be read or written or is no longer there.
    void stream(Pass pass, const std::function<void(const Chunk&)>& visit) override;

    // Bytes moved between the file and the buffers since the store was made.
    std::uint64_t bytes_read() const { return file_.bytes_read(); }
    std::uint64_t bytes_written() const { return file_.bytes_written(); }
    // Host memory the chunk buffers take.
    std::size_t buffer_bytes() const { return buffers_.size() * sizeof(float); }
    const std::string& path() const { return file_.path(); }
    std::size_t chunk() const override { return chunk_; }

private:
    Chunk chunk_at(std::size_t k, int buffer);
    std::uint64_t post(bool write, std::size_t k, int buffer);  // returns its sequence number

    std::size_t elements_, arrays_, chunk_, chunks_;
    std::vector<float> buffers_;  // 3 buffers of arrays·chunk floats (outlive the file's thread)
    io::OffloadFile file_;
};

}  // namespace trident::optim
