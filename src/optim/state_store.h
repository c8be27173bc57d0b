// Where a rank's optimizer state lives when it is off the device (optimizer.offload): the
// fp32 master weights and the optimizer's state arrays of what it owns (optim/optimizer.h),
// visited a chunk at a time, so that an update (optim/offload_update.cpp) walks host memory
// (optim/host_store.h) and a file (optim/offload_store.h) alike, whatever the optimizer. A
// chunk holds elements [first, first + count) of the state, as its arrays one after another:
// the master weights, then each state array in the optimizer's order (AdamW: m, then v).
#pragma once

#include <array>
#include <cstddef>
#include <functional>

#include "io/offload_file.h"

namespace trident::optim {

// A store could not be made (its memory, or its file's directory without room), or its file
// could not be read or written (or is gone): io/offload_file.h's error, which the host
// store throws too.
using io::OffloadError;

// The master weights and up to kMaxStates state arrays (optim/optimizer.h).
inline constexpr std::size_t kMaxArrays = 4;

class StateStore {
public:
    virtual ~StateStore() = default;

    // Elements [first, first + count) of the state, in host memory: `arrays` of (count) each,
    // the master weights first.
    struct Chunk {
        std::size_t first, count;
        std::array<float*, kMaxArrays> arrays;
        float* master() const { return arrays[0]; }
    };
    // read: each chunk as stored; write: each chunk as `visit` fills it (what was stored is
    // not read); update: read, visited, written back. Chunks in order.
    enum class Pass { read, write, update };
    virtual void stream(Pass pass, const std::function<void(const Chunk&)>& visit) = 0;
    virtual std::size_t chunk() const = 0;  // elements per chunk
};

}  // namespace trident::optim
