// Where a rank's optimizer state lives when it is off the device (optimizer.offload): the
// fp32 master weights and Adam's moments of what it owns, visited a chunk at a time, so that
// AdamW (optim/adamw_offload.cpp) walks host memory (optim/host_store.h) and a file
// (optim/offload_store.h) alike. A chunk holds elements [first, first + count) of the state,
// as its master weights, then m, then v.
#pragma once

#include <cstddef>
#include <functional>

#include "io/offload_file.h"

namespace trident::optim {

// A store could not be made (its memory, or its file's directory without room), or its file
// could not be read or written (or is gone): io/offload_file.h's error, which the host
// store throws too.
using io::OffloadError;

class StateStore {
public:
    virtual ~StateStore() = default;

    // Elements [first, first + count) of the state, in host memory.
    struct Chunk {
        std::size_t first, count;
        float *master, *m, *v;  // (count) each
    };
    // read: each chunk as stored; write: each chunk as `visit` fills it (what was stored is
    // not read); update: read, visited, written back. Chunks in order.
    enum class Pass { read, write, update };
    virtual void stream(Pass pass, const std::function<void(const Chunk&)>& visit) = 0;
    virtual std::size_t chunk() const = 0;  // elements per chunk
};

}  // namespace trident::optim
