// The grid of one process (parallel::Grid's 1 x 1 x 1 x 1), shared by the single-process
// tests that build a Trainer: its groups hold no state a test could leave behind.
#pragma once

#include "parallel/grid.h"

namespace trident::test {

inline parallel::Grid& solo_grid() {
    static parallel::Grid grid;
    return grid;
}

}  // namespace trident::test
