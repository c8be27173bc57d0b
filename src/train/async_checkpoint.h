// Asynchronous checkpoints (checkpoint.async): the save of a step copies this rank's share to
// host memory and returns; a background thread writes the shard while training goes on, and
// the save is committed (the ranks agree, rank 0 writes the manifest and renames the
// directory: train/checkpoint.h) once every rank has written, at the first step boundary
// that finds them all done, or when the next save or the run's end waits for it. Until then
// the save is a .tmp_ directory, so a crash at any point leaves the previous checkpoint as
// it was. The training thread alone communicates; the writer only writes files.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "parallel/comm.h"
#include "train/checkpoint.h"

namespace trident::train {

class AsyncCheckpoint {
public:
    AsyncCheckpoint() = default;
    // Waits for a write under way, without committing it (a run that ends on an error).
    ~AsyncCheckpoint();
    AsyncCheckpoint(const AsyncCheckpoint&) = delete;
    AsyncCheckpoint& operator=(const AsyncCheckpoint&) = delete;

    // Writes `save` (begun with begin_save, none pending) from a background thread.
    void start(PendingSave save);
    bool pending() const { return save_ != nullptr; }
    // Whether this rank's writer is still at work.
    bool writing() const { return writing_.load(); }
    // Waits for this rank's writer and commits the save (collective over `world`): its
    // directory, or CheckpointError on every rank. Nothing is pending after.
    std::string finish(parallel::Comm& world);

private:
    void join();

    std::unique_ptr<PendingSave> save_;
    std::thread writer_;
    std::atomic<bool> writing_{false};
};

}  // namespace trident::train
