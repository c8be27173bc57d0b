// Which GPU each rank computes on: one GPU per rank, chosen by the rank's index on its node.
//
// The local rank comes from the launcher when it says (Open MPI's OMPI_COMM_WORLD_LOCAL_RANK,
// Slurm's SLURM_LOCALID), else from MPI (World::local_rank, a split of the world by shared
// memory). With more ranks on a node than visible GPUs, ranks share GPUs round-robin; NCCL
// refuses two ranks of one communicator on one GPU, so sharing is detected (the GPUs' UUIDs,
// gathered over the world) and collectives then go through MPI with host staging.
#pragma once

#include <string>
#include <vector>

namespace trident::parallel {

class World;

struct GpuBinding {
    int device = -1;      // CUDA device index on this rank's node
    bool shared = false;  // some GPU of the job serves more than one rank
    std::string gpu;      // e.g. "NVIDIA H100 80GB HBM3 (GPU 0, 132 SMs, 79.1 GiB)"
};

// Whether every rank of the world sees at least one GPU; `missing` receives, on every rank,
// the ranks that see none and why (e.g. "rank 3: no CUDA-capable device is detected").
// Collective over the world.
bool every_rank_has_gpu(World& world, std::vector<std::string>& missing);

// Chooses this rank's GPU, makes it current (kernels/cuda/device.h) and finds whether GPUs are
// shared. Throws trident::Error when this rank sees no GPU. Collective over the world.
GpuBinding bind_gpu(World& world);

}  // namespace trident::parallel
