// The global L2 norm of the gradients and the factor that clips them (torch.nn.utils.
// clip_grad_norm_: scale by max/(norm + 1e-6) when the norm exceeds max), apart from any
// optimizer. The norm is global over the whole grid, with tensors held more than once counted
// once: replicated ones (LayerNorms, row-parallel biases, wpe) on tensor rank 0, a key/value
// head's rows on the first of its replicas, the tied wte on the first stage; each replica of the
// data-context group holds a D-th of the sum when the state is sharded (with hybrid sharding,
// each rank of a shard group an N-th: the shard groups hold the same sums). With the experts
// split (model/param_layout.h) each expert rank holds its experts' squares: summed over the
// expert group when the state is not sharded. Sharded, the shard group's sum holds them once:
// its N ranks are E expert ranks' sets of N/E expert-shard ranks (E divides N), each set owning
// disjoint parts covering its experts' runs, so Σ over the shard group = Σ_rest + Σ_j Σ_experts
// of expert rank j, every owned element once.
#pragma once

#include <vector>

#include "data_parallel/data_parallel.h"
#include "kernels/device_buffer.h"
#include "kernels/ops.h"
#include "model/flat_buffer.h"
#include "optim/owned_ranges.h"
#include "parallel/comm.h"

namespace trident::optim {

// The groups over which the gradient norm's partial sums add up (besides the data group,
// whose replicas each own a part when the optimizer state is sharded).
struct NormGroups {
    parallel::Comm& tensor;
    parallel::Comm& pipeline;
    parallel::Comm& experts;  // the expert group
};

class GradNorm {
public:
    // The norm of `grads` over the owned `ranges` this rank counts.
    GradNorm(kernels::Ops& ops, std::vector<OwnedRange> ranges, const model::FlatBuffer& grads,
             const data_parallel::DataParallel& data_parallel, const NormGroups& groups);

    // Collective over the grid, the same on every rank, and inf or NaN on every rank if any
    // gradient anywhere is.
    double norm() const;

private:
    kernels::Ops& ops_;
    std::vector<OwnedRange> ranges_;
    const model::FlatBuffer& grads_;
    const data_parallel::DataParallel& data_parallel_;
    NormGroups groups_;
    kernels::DeviceBuffer total_;  // (2) f64: the squared norm, on the device, and the experts'
};

// The factor that clips gradients of norm `norm` to `max_norm` (1: not clipped; max_norm <= 0:
// no clipping).
float clip_factor(double max_norm, double norm);

}  // namespace trident::optim
