// Rank-to-GPU binding (see gpu_binding.h).
#include "parallel/cuda/gpu_binding.h"

#include <mpi.h>

#include <cstdlib>
#include <set>

#include "kernels/cuda/device.h"
#include "kernels/error.h"
#include "parallel/world.h"

namespace trident::parallel {

namespace {

// The rank's index on its node, as the launcher numbers it when it tells.
int local_rank(const World& world) {
    for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"}) {
        if (const char* value = std::getenv(name)) {
            char* end = nullptr;
            const long rank = std::strtol(value, &end, 10);
            if (end != value && *end == '\0' && rank >= 0) return static_cast<int>(rank);
        }
    }
    return world.local_rank();
}

// Every rank's fixed-width text, gathered on every rank.
std::vector<std::string> all_gather_text(const std::string& mine, int ranks) {
    constexpr int kWidth = 128;
    std::string padded = mine.substr(0, kWidth - 1);
    padded.resize(kWidth, '\0');
    std::vector<char> all(static_cast<std::size_t>(kWidth) * ranks);
    MPI_Allgather(padded.data(), kWidth, MPI_CHAR, all.data(), kWidth, MPI_CHAR, MPI_COMM_WORLD);
    std::vector<std::string> texts;
    for (int r = 0; r < ranks; ++r)
        texts.emplace_back(all.data() + static_cast<std::size_t>(r) * kWidth);
    return texts;
}

}  // namespace

bool every_rank_has_gpu(World& world, std::vector<std::string>& missing) {
    std::string why;
    const bool mine = kernels::cuda::visible_gpu_count(&why) > 0;
    // An empty reason: the rank sees a GPU (visible_gpu_count always says why it saw none).
    const std::vector<std::string> reasons = all_gather_text(mine ? "" : why, world.size());
    missing.clear();
    for (int r = 0; r < world.size(); ++r)
        if (!reasons[static_cast<std::size_t>(r)].empty())
            missing.push_back("rank " + std::to_string(r) + ": " +
                              reasons[static_cast<std::size_t>(r)]);
    return missing.empty();
}

GpuBinding bind_gpu(World& world) {
    std::string why;
    const int count = kernels::cuda::visible_gpu_count(&why);
    GpuBinding binding;
    // Every rank takes part in the gather below, with or without a GPU, so none waits.
    std::string uuid;
    if (count > 0) {
        binding.device = local_rank(world) % count;
        kernels::cuda::use_gpu(binding.device);
        binding.gpu = kernels::cuda::describe_gpu();
        uuid = kernels::cuda::gpu_uuid(binding.device);
    }
    const std::vector<std::string> uuids = all_gather_text(uuid, world.size());
    if (count == 0)
        throw Error("no GPU for this rank (" + why +
                    "); check CUDA_VISIBLE_DEVICES and the driver, or use device: cpu");
    std::set<std::string> distinct(uuids.begin(), uuids.end());
    binding.shared = distinct.size() < uuids.size();
    return binding;
}

}  // namespace trident::parallel
