// One update of the parts of the model's trainable buffers this rank owns
// (data_parallel/data_parallel.h decides which): the optimizer's step (optim/optimizer.h) on
// their fp32 master weights and its state, wherever those live, and the parameters rounded from
// the master weights.
//
// The master weights are taken from the parameters at the first update (so the model may be
// initialised or loaded until then), and each update rounds them, in the same pass, into the
// parameters (16-bit or fp32); the data-parallel part then makes them whole on every replica.
// Where the state lives is a placement (optim/placement.h), usable by any optimizer:
// - on the device (optimizer.offload: none): the master weights and the optimizer's state
//   arrays of what this rank owns (AdamW: 12 bytes per owned parameter), an array kept for
//   one group of parameters only (optim/optimizer.h, StateGroup) sized to that group's;
// - in a file (nvme; optim/offload_store.h), streamed chunk by chunk through a device buffer of
//   one chunk: the same update, element by element, so the same bits. With ZeRO-3's parameter
//   shard in a file too (optimizer.offload_params, data_parallel/param_file.h), each chunk's
//   updated parameters are rounded into a device buffer of one chunk and written to that file
//   (the first update reads them from it first, to take the master weights);
// - in host memory (host; optim/host_store.h), the update run there on host threads through the
//   optimizer's host loop: each chunk's gradients come down, the updated master weights go back
//   up rounded to the parameters' type.
// Off the device every array holds every owned element (an array kept for one group zero over
// the other: Muon 16 bytes per owned parameter, GaLore 12), and an optimizer stepping whole
// matrices streams the state twice per update: its matrix inputs (Muon's momentum), then the
// element updates along the directions. Its per-matrix state (GaLore's) stays on the device
// with its owner (optim/matrix_exchange.h), wherever the per-element state lives.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "config/config.h"
#include "data_parallel/data_parallel.h"
#include "kernels/ops.h"
#include "model/flat_buffer.h"
#include "model/param_layout.h"
#include "optim/matrix_exchange.h"
#include "optim/offload_store.h"
#include "optim/optimizer.h"
#include "optim/owned_ranges.h"

namespace trident::optim {

// What an update works on, whatever holds the state.
struct UpdateScope {
    kernels::Ops& ops;
    const data_parallel::DataParallel& data_parallel;
    std::vector<OwnedRange> ranges;  // what this rank owns, in buffer order
    model::FlatBuffer& params;
    model::FlatBuffer& grads;
    const Optimizer& optimizer;
    float weight_decay = 0;  // training.weight_decay, on the decayed group
    std::size_t arrays = 1;  // per parameter: the master weights and the optimizer's state
    // An optimizer that steps whole matrices: their exchange, and the matrices' directions on
    // the owned elements (host memory, the owned count, in state order); else null and empty.
    MatrixExchange* matrices = nullptr;
    std::vector<float> directions;
    // Its scratch in the backend's memory (matrix_scratch of the layout), which the matrix
    // steps use and the segments' shares are staged through (Segment::staging).
    std::span<float> scratch;
    // Every array holds every owned element, in state order (a store's chunks, off the
    // device): an array kept for one group is zero over the other's elements.
    bool whole_arrays = false;

    // Which parameters array a (0: the master weights, then the optimizer's state) is kept
    // for, and its elements on this rank: the owned count, or the owned elements of its group.
    StateGroup group(std::size_t a) const;
    std::size_t count(std::size_t a) const;
    // Range r's parameters as the optimizer sees them, its arrays `arrays` (master, state...)
    // from `at` (an array kept for one group: from r.grouped, or from `at` with whole_arrays;
    // null outside it), its gradients
    // where they are in the buffer, its updated weights to `params` (a matrix's direction from
    // `directions` at r.state).
    Segment segment(const OwnedRange& r, float* const* arrays, std::size_t at,
                    kernels::Ptr params) const;
    // Before the element updates: the whole-matrix step of every matrix range (r.state into
    // `arrays` as above) into `directions`. Collective (optim/matrix_exchange.h).
    void step_matrices(float* const* arrays, const Hyper& h);
};

// Where the state lives, and how an update reaches it (see the top of this file).
class Placement {
public:
    virtual ~Placement() = default;
    // One update with `h`; `first`: the master weights are taken from the parameters first.
    virtual void update(const Hyper& h, bool first) = 0;
    // The owned parameters as the master weights give them, rounded to their type.
    virtual void params_from_master() = 0;
    // The state into `s` (its values the buffer's size; before the first update, `first`, the
    // master weights are the parameters), and back.
    virtual void read(OptimizerState& s, bool first) const = 0;
    virtual void write(const OptimizerState& s) = 0;
    // The state's file (nvme), or null.
    virtual const OffloadStore* file() const { return nullptr; }
    // Adds delta (fp32) to the master weights of the owned elements among [offset, offset +
    // delta.size()) and rounds them into their parameters (Updater::add_to_master).
    virtual void add_to_master(std::size_t offset, std::span<const float> delta) = 0;
};

// Calls visit(at, state, count) for each run of buffer elements [offset, offset + n) in an
// owned part, in order: its first element offset + at, whose state is at `state`.
void for_owned_in(const std::vector<data_parallel::OwnedPart>& owned, std::size_t offset,
                  std::size_t n,
                  const std::function<void(std::size_t, std::size_t, std::size_t)>& visit);

std::unique_ptr<Placement> device_placement(UpdateScope& scope);
std::unique_ptr<Placement> host_placement(UpdateScope& scope, std::size_t chunk, int threads);
std::unique_ptr<Placement> file_placement(UpdateScope& scope, const std::string& dir, int rank,
                                          std::size_t chunk);

class Updater {
public:
    // `params` and `grads`: the model's trainable buffers, the parts `data_parallel` says this
    // rank owns updated. `offload` says where the state lives; `rank` (the world rank) names
    // this rank's state file.
    // `tensor`: the tensor group, over which an optimizer stepping whole matrices assembles
    // them (with the data-parallel shard group).
    Updater(kernels::Ops& ops, const model::ParamLayout& layout, const config::TrainingConfig& cfg,
            const config::OptimizerConfig& offload, int rank,
            const data_parallel::DataParallel& data_parallel, parallel::Comm& tensor,
            model::FlatBuffer& params, model::FlatBuffer& grads);

    const Optimizer& optimizer() const { return *optimizer_; }
    const std::vector<OwnedRange>& ranges() const { return scope_.ranges; }
    // One update with learning rate lr on the gradients times grad_scale (unscaling and
    // clipping) of what this rank owns: its master weights, rounded into its parameters.
    // Advances the step count. The parameters' gather of the last update must have finished.
    void step(double lr, float grad_scale);
    int steps_taken() const { return step_; }
    // What a checkpoint keeps (OptimizerState). Before the first update the master weights are
    // the parameters, as step 1 takes them. The parameters' gather must have finished.
    OptimizerState state() const;
    // The reverse, from a state of this buffer layout (only the owned elements are read; every
    // name the optimizer keeps must be there, or with `zero_missing` those not there start
    // from zero); the next update continues from it.
    void restore(const OptimizerState& state, bool zero_missing = false);
    // The parameters this rank owns as an update leaves them: its master weights, rounded to
    // the parameters' type (the data-parallel part then gathers them).
    void params_from_master();
    // A tensor the optimizer does not train, moved by a rule of its own (a mixture of experts'
    // router bias, train/moe_balance.h): delta (fp32) added to the master weights of buffer
    // elements [offset, offset + delta.size()) this rank owns, rounded into their parameters
    // (the data-parallel part then gathers them). After the first update; not with the state in
    // a file (optimizer.offload: nvme), where it would stream the whole state.
    void add_to_master(std::size_t offset, std::span<const float> delta);
    // Bytes of optimizer state this rank holds on the device, as the allocator counted them.
    std::size_t state_bytes() const { return state_bytes_; }
    // The state's file (optimizer.offload: nvme), or null.
    const OffloadStore* store() const { return placement_->file(); }
    // The per-matrix state this rank holds (OptimizerState::matrices' names, and elements),
    // for a resume to read.
    std::map<std::string, std::size_t> matrix_states() const {
        return matrices_ ? matrices_->held() : std::map<std::string, std::size_t>{};
    }

private:
    // The state's names, in this optimizer's order, their values zero.
    OptimizerState empty_state() const;

    std::unique_ptr<Optimizer> optimizer_;
    std::unique_ptr<MatrixExchange> matrices_;  // an optimizer stepping whole matrices; else null
    kernels::DeviceBuffer scratch_;             // (matrix_scratch) fp32: scope_.scratch
    UpdateScope scope_;
    std::unique_ptr<Placement> placement_;
    std::size_t size_;  // elements in the buffers
    std::size_t state_bytes_ = 0;
    int step_ = 0;  // the master weights are taken from the parameters before step 1
};

// Bytes of optimizer state per owned parameter (the master weights and the optimizer's arrays
// kept for it, fp32), for a config's optimizer: of a layer's weight matrix and of the rest
// (AdamW: 12 each; Muon: 8 and 12; GaLore 4 and 12). Off the device (optimizer.offload) every
// array is kept for every parameter (Muon: 16 each; GaLore: 12 each).
struct StateBytes {
    std::size_t matrix = 0, other = 0;
    std::size_t most() const { return matrix > other ? matrix : other; }
};
StateBytes state_bytes(const config::TrainingConfig& t, const config::OptimizerConfig& o);

// The passes an update makes over the state off the device (optimizer.offload), reading it and
// writing it: one each, and for an optimizer stepping whole matrices one more first, for their
// inputs, which writes the state back where the matrices keep an array of their own (Muon's
// momentum; not GaLore's).
struct StatePasses {
    int read = 1, written = 1;
};
StatePasses state_passes(const Optimizer& optimizer);
StatePasses state_passes(const config::TrainingConfig& t, const config::OptimizerConfig& o);

// Elements of a state array kept for group g (StateGroup::all: every one of the `owned`
// elements; else the ranges of that group).
std::size_t group_count(StateGroup g, const std::vector<OwnedRange>& ranges, std::size_t owned);
// Bytes of the state an Updater keeps on the device for `ranges` of `owned` owned elements: the
// master weights and each of `optimizer`'s arrays, fp32 (its per-matrix state aside).
std::size_t owned_state_bytes(const Optimizer& optimizer, const std::vector<OwnedRange>& ranges,
                              std::size_t owned);

// Bytes of the state `optimizer` keeps per whole matrix (Optimizer::matrix_states, fp32) for
// the layer matrices i = 0, stride, 2·stride, ... of `layout`'s shard group's in stepping order
// and i = 0, expert_stride, ... of its split experts' (strides S·M and S_e·M: what the owner of
// their first matrices holds, optim/matrix_exchange.h; 1: all of them).
std::size_t matrix_state_bytes(const Optimizer& optimizer, const model::ParamLayout& layout,
                               std::size_t stride = 1, std::size_t expert_stride = 1);

// Floats of the scratch an Updater holds for `optimizer`'s whole-matrix work on `layout`: the
// most Optimizer::matrix_scratch asks for any of its layer matrices (0 for one that steps no
// whole matrices). Allocated with the Updater, apart from the optimizer state.
std::size_t matrix_scratch(const Optimizer& optimizer, const model::ParamLayout& layout);

}  // namespace trident::optim
