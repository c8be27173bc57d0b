// The memory figures of every pipeline stage (see stage_memory.h).
#include "commands/stage_memory.h"

#include "kernels/dtype.h"

namespace trident::commands {

std::vector<std::array<int64_t, 5>> memory_of_stages(const train::MemoryUse& mine,
                                                     const parallel::Grid& grid,
                                                     parallel::World& world) {
    const std::array<int64_t, 5> figures = {
        static_cast<int64_t>(mine.parameters), static_cast<int64_t>(mine.gradients),
        static_cast<int64_t>(mine.optimizer), static_cast<int64_t>(mine.activations),
        static_cast<int64_t>(mine.peak)};
    std::vector<std::array<int64_t, 5>> all(static_cast<std::size_t>(world.size()));
    world.comm().all_gather(kernels::ConstPtr(figures.data(), kernels::DType::u8),
                            kernels::Ptr(all.data(), kernels::DType::u8), sizeof figures);
    std::vector<std::array<int64_t, 5>> stages;
    if (world.rank() != 0) return stages;
    for (int r = 0; r < world.size(); ++r) {
        const parallel::Coordinates c = parallel::coordinates_of(grid.shape(), r);
        if (c.tp == 0 && c.cp == 0 && c.dp == 0) stages.push_back(all[static_cast<std::size_t>(r)]);
    }
    return stages;
}

}  // namespace trident::commands
