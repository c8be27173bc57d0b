// AdamW with global-norm gradient clipping on the parts of the model's flat buffers this rank
// owns (src/data_parallel/data_parallel.h decides which: all of them, or a ZeRO shard).
//
// Numerics follow torch.optim.AdamW (bias-corrected moments, decoupled weight decay) and
// torch.nn.utils.clip_grad_norm_ (scale by max/(norm + 1e-6) when the norm exceeds max).
// Decay applies to weight matrices and embeddings only; the layout says which ranges.
//
// This rank holds the fp32 master weights and Adam's moments of what it owns only (12 bytes
// per owned parameter). Mixed precision: the parameters and gradients may be 16-bit; each
// update writes the master weights, rounded, back into the parameters in the same pass, and
// the data-parallel part then makes them whole on every replica.
//
// With optimizer.offload: nvme the master weights and moments live in a file instead
// (optim/offload_store.h), streamed chunk by chunk through a device buffer of one chunk: the
// same update, element by element, so the same bits. With ZeRO-3's parameter shard in a file
// too (optimizer.offload_params, data_parallel/param_file.h), each chunk's updated parameters
// are rounded into a device buffer of one chunk and written to that file (the first update
// reads them from it first, to take the master weights). With offload: host they live in host
// memory (optim/host_store.h) and the update runs there, on host threads, through the CPU
// backend's own element loop (kernels/host_adamw.h): each chunk's gradients come down, the
// updated master weights go back up rounded to the parameters' type.
//
// Under tensor and pipeline parallelism each rank updates its part; the gradient norm is
// global over the whole grid, with tensors held more than once counted once: replicated ones
// (LayerNorms, row-parallel biases, wpe) on tensor rank 0, the tied wte on the first stage.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "config/config.h"
#include "data_parallel/data_parallel.h"
#include "kernels/device_buffer.h"
#include "kernels/ops.h"
#include "model/flat_buffer.h"
#include "model/param_layout.h"
#include "optim/offload_store.h"
#include "optim/state_store.h"
#include "parallel/comm.h"

namespace trident::optim {

// The groups over which the gradient norm's partial sums add up (besides the data group,
// whose replicas each own a part when the optimizer state is sharded).
struct NormGroups {
    parallel::Comm& tensor;
    parallel::Comm& pipeline;
};

class AdamW {
public:
    // `params` and `grads`: the model's buffers, the parts `data_parallel` says this rank owns.
    // The master weights start as the parameters at the first step, so the model may be
    // initialised or loaded until then. `offload` says where the state lives; `rank` (the
    // world rank) names this rank's state file.
    AdamW(kernels::Ops& ops, const model::ParamLayout& layout, const config::TrainingConfig& cfg,
          const config::OptimizerConfig& offload, int rank,
          const data_parallel::DataParallel& data_parallel, const NormGroups& groups,
          model::FlatBuffer& params, model::FlatBuffer& grads);

    // Global L2 norm of the reduced gradients; collective over the grid, the same on every
    // rank, and inf or NaN on every rank if any gradient anywhere is.
    double grad_norm() const;
    // The factor that clips gradients of this norm to the configured one (1: not clipped).
    float clip_factor(double norm) const;
    // One update with learning rate lr on the gradients times grad_scale (unscaling and
    // clipping) of what this rank owns: its master weights, rounded into its parameters.
    // Advances the step count. The parameters' gather of the last update must have finished.
    void step(double lr, float grad_scale);
    int steps_taken() const { return step_; }

    // What a checkpoint keeps, in buffer coordinates: host vectors of the buffer's size
    // holding this rank's fp32 master weights and moments where it owns elements (zero
    // elsewhere), and Adam's step count.
    struct State {
        std::vector<float> master, m, v;
        int step = 0;
    };
    // Before the first update the master weights are the parameters, as step 1 takes them.
    // The parameters' gather must have finished.
    State state() const;
    // The reverse, from a State of this buffer layout (only the owned elements are read);
    // the next update continues from it instead of taking the parameters.
    void restore(const State& state);
    // The parameters this rank owns as an update leaves them: its master weights, rounded to
    // the parameters' type (the data-parallel part then gathers them).
    void params_from_master();
    // Bytes of optimizer state this rank holds (fp32 master weights, m and v), as the
    // allocator counted them.
    std::size_t state_bytes() const { return state_bytes_; }
    // The state's file (optimizer.offload: nvme), or null.
    const OffloadStore* store() const { return file_; }

private:
    // A maximal run of owned tensors alike.
    struct Range {
        std::size_t offset, count;
        std::size_t state;  // offset in the master weights and moments
        bool decay;
        bool counted;  // in the norm on this rank (held once here, not a copy)
    };
    void add_ranges(const model::ParamLayout& layout);
    // step, params_from_master, state and restore on the state in the store.
    void step_offloaded(float lr, float grad_scale);
    // One chunk's update: on the device (nvme) or on the host (host); `first`: the master
    // weights are taken from the parameters.
    void update_on_device(const StateStore::Chunk& c, bool first, float lr, float grad_scale);
    void update_on_host(const StateStore::Chunk& c, bool first, float lr, float grad_scale);
    void params_from_store();
    State state_from_store() const;
    void restore_into_store(const State& s);
    // Where a streamed update writes the parameter at element `at` of its chunk, buffer
    // element `offset`: param_chunk_ (offloaded parameters) or the shard.
    kernels::Ptr param_of(std::size_t at, std::size_t offset) const;

    kernels::Ops& ops_;
    config::TrainingConfig cfg_;
    const data_parallel::DataParallel& data_parallel_;
    NormGroups groups_;
    model::FlatBuffer& params_;
    model::FlatBuffer& grads_;
    std::size_t size_;                      // elements in the buffers
    std::vector<Range> ranges_;             // in buffer order
    kernels::DeviceBuffer master_, m_, v_;  // fp32 master weights and Adam's moments (owned)
    std::unique_ptr<StateStore> store_;     // instead of them, with offload: host or nvme
    OffloadStore* file_ = nullptr;          // store_, with offload: nvme
    kernels::DeviceBuffer chunk_;           // (3 · chunk) fp32: a chunk of the file's
    kernels::DeviceBuffer param_chunk_;     // (chunk) the parameters' type: offloaded params
    std::vector<char> param_host_;          // (chunk) the same on the host, to and from the file
    kernels::HostBuffer host_grads_;        // (chunk) fp32: a chunk's gradients (host)
    kernels::HostBuffer staging_;           // (chunk) 16-bit: their transfers' staging (host)
    int host_threads_ = 1;                  // the host update's threads (host)
    kernels::DeviceBuffer norm_total_;      // (1) f64: the squared gradient norm, on the device
    std::size_t state_bytes_ = 0;
    int step_ = 0;  // the master weights are taken from the parameters before step 1
};

}  // namespace trident::optim
