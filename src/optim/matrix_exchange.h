// Whole matrices for an optimizer that steps them whole (Muon, optim/muon.h), assembled from
// the pieces ranks own and split back: Moonlight's and Megatron's distributed Muon. A layer's
// matrix lies in pieces over two groups: the tensor group (each rank its slice: a column
// split's rows, a row split's columns; model/param_layout.h) and the data-parallel shard group
// (at ZeRO 1-3 each replica owns a part of every slice; at ZeRO 0 every replica owns it all).
// Matrix k of a stage (in the stepping order: the costliest step first, stepping_order) is
// stepped by one owner, in turns: shard rank k mod S of tensor rank ⌊k / S⌋ mod M. Its slice is
// summed on that shard rank from the owned parts (zero elsewhere, so the sum is exact), the slices
// sent to the owner, the matrix stepped there, each slice sent back, and the slice broadcast over
// the shard group, whose ranks keep their owned parts of it. The matrices go in rounds of S·M, one
// per owner: the round's slices are all assembled first, then every owner steps its matrix at the
// same time as the others, then the round is split back. So each matrix is whole on one rank of the
// stage's M·S, never every matrix on every rank, and the steps of a round run side by side, and a
// round holds matrices of like cost. Hybrid sharding's replica groups each do the same, alike.
// Where the experts are split over E (model/param_layout.h, split_expert), a rank holds only its
// experts' matrices, summed and sharded over the expert-shard group (data_parallel.h): those
// matrices come after the rest, in their own rounds, their shard group the expert-shard group (its
// ranks hold the same experts, so each expert-shard group takes its own matrices' turns; with
// hybrid sharding each shard group's expert-shard groups alike, as its rest's rounds). The
// exchanges are host memory through the group's communicator, on any backend: the pieces come
// down from the device before (Optimizer::matrix_input) and the directions go back up after
// (Optimizer::update). The state an optimizer keeps per matrix (Optimizer::matrix_states:
// GaLore's) lives on that owner alone, whole, in buffers of the op set (counted as optimizer
// state), comes down to host memory for its matrix's step and goes back up after it, and is read
// and written by the tensor's whole-model name, so checkpoints reshard it by name.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "data_parallel/data_parallel.h"
#include "kernels/device_buffer.h"
#include "model/param_layout.h"
#include "optim/optimizer.h"
#include "parallel/comm.h"

namespace trident::optim {

// The layer matrices of `layout` (owned_ranges.h, is_layer_matrix) in the order they are
// stepped: those over the shard group, then the split experts' over the expert-shard group
// (from `experts` on); each by Optimizer::matrix_step_flops of the whole matrix, the costliest
// first, ties in the layout's order.
struct SteppingOrder {
    std::vector<const model::ParamTensor*> matrices;
    std::size_t experts = 0;
};
SteppingOrder stepping_order(const model::ParamLayout& layout, const Optimizer& optimizer);

class MatrixExchange {
public:
    // The layer matrices of `layout` (owned_ranges.h, is_layer_matrix), owned as
    // `data_parallel` says, split over `tensor`; the per-matrix state `optimizer` keeps for
    // those this rank steps, zero, from `ops`.
    MatrixExchange(kernels::Ops& ops, const model::ParamLayout& layout,
                   const data_parallel::DataParallel& data_parallel, parallel::Comm& tensor,
                   const Optimizer& optimizer);

    // `pieces` (the owned count, host memory, in the owned parts' state order): each matrix's
    // input to the optimizer's matrix_step on the elements this rank owns, replaced by the
    // step's result there. Collective over the tensor, shard and expert-shard groups.
    // `scratch`: the backend's memory for each step (Optimizer::matrix_scratch).
    void step(const Optimizer& optimizer, float* pieces, const Hyper& h, std::span<float> scratch);

    // The per-matrix state of the matrices this rank steps into s.matrices ("NAME/TENSOR"),
    // and back (a name missing: zero with `zero_missing`, else refused).
    void read(OptimizerState& s) const;
    void write(const OptimizerState& s, bool zero_missing);
    // The per-matrix state this rank holds: names ("NAME/TENSOR") and elements.
    std::map<std::string, std::size_t> held() const;

private:
    // Matrix k: its slice (numel) from the owned pieces and back.
    void gather_owned(const model::ParamTensor& t, const float* pieces, float* slice) const;
    void scatter_owned(const model::ParamTensor& t, const float* slice, float* pieces) const;
    // The slices summed on rank `owner` of `shard` (ZeRO 1-3).
    void sum_slices(parallel::Comm& shard, std::vector<float>& slice, int owner) const;
    // Matrices [first, end), one per owner: their slices summed and sent to the owners, each
    // owner's matrix stepped (all owners at once), the slices sent back and broadcast.
    void step_round(const Optimizer& optimizer, std::size_t first, std::size_t end, float* pieces,
                    const Hyper& h, std::span<float> scratch);
    // On matrix k's shard owner: the tensor group's slices into `whole` (rows × cols) on its
    // tensor owner (true there), and back into each rank's `slice`.
    bool assemble(std::size_t k, const std::vector<float>& slice, std::vector<float>& whole) const;
    void split(std::size_t k, const std::vector<float>& whole, std::vector<float>& slice) const;
    // The optimizer's matrix_step of matrix k, whole, with its state.
    void step_whole(const Optimizer& optimizer, std::size_t k, std::vector<float>& whole,
                    const Hyper& h, std::span<float> scratch);
    // Matrix k's shard group (of S ranks), and its owner: shard rank i mod S, tensor rank
    // ⌊i / S⌋ mod M, where i is k's place among the matrices of its shard group.
    parallel::Comm& shard_of(std::size_t k) const;
    std::size_t place(std::size_t k) const;
    int shard_owner(std::size_t k) const;
    int tensor_owner(std::size_t k) const;

    kernels::Ops& ops_;
    const data_parallel::DataParallel& data_parallel_;
    parallel::Comm& tensor_;
    std::vector<const model::ParamTensor*> matrices_;
    std::size_t experts_;  // the first split expert's matrix (SteppingOrder::experts)
    // Per matrix: its state's names and, on its owner, buffers (in matrix_states' order).
    std::vector<std::vector<std::string>> names_;
    std::vector<std::vector<kernels::DeviceBuffer>> states_;
};

}  // namespace trident::optim
