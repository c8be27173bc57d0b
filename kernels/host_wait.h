// The host's waits for the device, made visible to whatever watches for stalls. A backend marks
// each wait with a HostWait on the stack (a copy to the host, a synchronisation: on a GPU
// that is where NCCL's collectives complete); the watcher installed from above (the stall
// watchdog, src/parallel/watchdog.h) is told when it begins and ends. kernels/ knows nothing
// of the watcher.
#pragma once

namespace trident::kernels {

// begin() is called as a wait begins, on the waiting thread, and returns what end() is given
// as it ends.
struct HostWaitWatcher {
    void* (*begin)() = nullptr;
    void (*end)(void* begun) = nullptr;
};

// Installs the watcher (one per process; a watcher of nulls removes it).
void watch_host_waits(HostWaitWatcher watcher);

class HostWait {
public:
    HostWait() noexcept;
    ~HostWait();
    HostWait(const HostWait&) = delete;
    HostWait& operator=(const HostWait&) = delete;

private:
    void* begun_ = nullptr;
};

}  // namespace trident::kernels
