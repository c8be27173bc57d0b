// An exclusive lock on a run's checkpoint directory for as long as the run lives, so that two
// runs never write one directory: each would delete the other's temporary saves and newer
// checkpoints (checkpoint.h). The lock is flock(2) on DIR/.lock, which also records the
// holder (host, pid) for the message the second run gets; the kernel drops it when the
// holder exits, however it ends, so a crashed run leaves nothing to clean up.
#pragma once

#include <memory>
#include <string>

namespace trident::train {

class DirectoryLock {
public:
    // Takes the lock of `dir` (created if missing), or throws trident::Error naming the
    // holder: "checkpoint.dir: 'runs/x' is in use by another run (host h, pid 123) ...".
    explicit DirectoryLock(const std::string& dir);
    ~DirectoryLock();
    DirectoryLock(const DirectoryLock&) = delete;
    DirectoryLock& operator=(const DirectoryLock&) = delete;

    // Whether DIR/.lock is still the file this lock holds: false once the directory was
    // removed (rm -rf under the run) or replaced, taking the lock and the metrics with it.
    bool still_held() const;

private:
    std::string path_;
    int fd_ = -1;
};

// An exclusive lock on a run's metrics file (logging.metrics) for the run's life: two runs
// appending to one file tear each other's lines and one's steps are lost. flock(2) on the
// file itself, opened (created if missing) without cutting it: the run's MetricsLog decides
// what it keeps; a file the lock created and nothing wrote is removed with the lock. The holder is
// not written into it (it is the metrics); a second run gets "logging.metrics: 'm.jsonl' is being
// written by another run ...".
class FileLock {
public:
    FileLock(const std::string& path, const std::string& what);
    ~FileLock();
    FileLock(const FileLock&) = delete;
    FileLock& operator=(const FileLock&) = delete;

private:
    int fd_ = -1;
    std::string created_;  // the path, when this lock made the file (removed again if empty)
};

// `dir` made, probed writable (a file written, synced and removed) and locked: what would make
// the run's saves fail is known before step 1, not at the first save with the whole run's
// work at stake. Throws trident::Error naming the cause.
std::unique_ptr<DirectoryLock> claim_checkpoint_dir(const std::string& dir);

}  // namespace trident::train
