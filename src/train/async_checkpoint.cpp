// Asynchronous checkpoints (see async_checkpoint.h).
#include "train/async_checkpoint.h"

namespace trident::train {

AsyncCheckpoint::~AsyncCheckpoint() {
    join();
}

void AsyncCheckpoint::start(PendingSave save) {
    save_ = std::make_unique<PendingSave>(std::move(save));
    writing_.store(true);
    writer_ = std::thread([this] {
        write_share(*save_);
        writing_.store(false);
    });
}

void AsyncCheckpoint::join() {
    if (writer_.joinable()) writer_.join();
}

std::string AsyncCheckpoint::finish(parallel::Comm& world) {
    join();
    std::unique_ptr<PendingSave> save = std::move(save_);
    return commit_save(*save, world);
}

}  // namespace trident::train
