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

private:
    int fd_ = -1;
};

// `dir` made, probed writable (a file written, synced and removed) and locked: what would make
// the run's saves fail is known before step 1, not at the first save with the whole run's
// work at stake. Throws trident::Error naming the cause.
std::unique_ptr<DirectoryLock> claim_checkpoint_dir(const std::string& dir);

}  // namespace trident::train
