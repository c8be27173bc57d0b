// The memory figures of every pipeline stage, gathered for the metrics (the last stage holds
// the LM head and the logits: its figures differ from rank 0's).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "parallel/grid.h"
#include "parallel/world.h"
#include "train/trainer.h"

namespace trident::commands {

// The memory figures of the first rank (tensor, context and data rank 0) of every pipeline
// stage, on rank 0 (the others: none), in stage order. Collective over the world.
std::vector<std::array<int64_t, 5>> memory_of_stages(const train::MemoryUse& mine,
                                                     const parallel::Grid& grid,
                                                     parallel::World& world);

}  // namespace trident::commands
