// The host's waits for the device and their watcher (see host_wait.h).
#include "kernels/host_wait.h"

#include <atomic>

namespace trident::kernels {

namespace {

std::atomic<void* (*)()> begin_hook{nullptr};
std::atomic<void (*)(void*)> end_hook{nullptr};

}  // namespace

void watch_host_waits(HostWaitWatcher watcher) {
    end_hook.store(watcher.end);
    begin_hook.store(watcher.begin);
}

HostWait::HostWait() noexcept {
    if (void* (*begin)() = begin_hook.load()) begun_ = begin();
}

HostWait::~HostWait() {
    if (void (*end)(void*) = end_hook.load(); end && begun_) end(begun_);
}

}  // namespace trident::kernels
