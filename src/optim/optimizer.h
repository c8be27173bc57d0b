// The optimizer interface: an algorithm that updates parameters from their gradients and keeps
// per-parameter state under names (torchtitan's OptimizersContainer is the model: any optimizer
// behind one state protocol, which checkpoints save and reshard without knowing the algorithm).
//
// It is apart from what surrounds every update (optim/update.h): the fp32 master weights and
// their rounding into the model's parameters, where the state lives (on the device, in host
// memory, in a file: optim/placement.h), the global gradient norm and clipping
// (optim/clipping.h). An algorithm sees segments: runs of owned parameters of one group (decayed
// or not), each with its master weights, its named state arrays and its gradients, on the device
// (update, through the op set's element kernels) or in host memory (update_host). AdamW
// (optim/adamw.h) is one implementation; an algorithm with state of its own per element (Muon's
// momentum) names it in state_names, per whole matrix (GaLore's projected moments and projector)
// in matrix_states, and checkpoints save, load and reshard it by those names as they do Adam's
// moments.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "config/config.h"
#include "kernels/ops.h"

namespace trident::optim {

// What every segment of one update shares.
struct Hyper {
    float lr = 0;          // this update's learning rate
    int step = 0;          // the update's number, 1-based
    float grad_scale = 1;  // the gradients' factor: fp16's unscaling and clipping in one
};

inline constexpr std::size_t kMaxStates = 3;  // state arrays an algorithm may keep per parameter

// Which owned parameters a state array is kept for: all of them, or one group only (the
// layers' weight matrices, optim/owned_ranges.h, or the rest), taking no memory for the other
// (Muon's momentum is the matrices' alone, AdamW's moments of its other parameters theirs).
enum class StateGroup { all, matrices, others };

inline bool covers(StateGroup g, bool matrix) {
    return g == StateGroup::all || (g == StateGroup::matrices) == matrix;
}

// A run of owned parameters of one group, updated alike: their fp32 master weights and state
// arrays (in state_names' order; null for an array not kept for its group), `count` each;
// their gradients; and where the updated weights go, rounded to the parameters' type (null:
// nowhere).
struct Segment {
    float* master = nullptr;
    std::array<float*, kMaxStates> state{};
    kernels::ConstPtr grads;
    kernels::Ptr params;
    std::size_t count = 0;
    float weight_decay = 0;  // its group's: matrices and embeddings decay, the rest not
    // Elements of the layers' weight matrices (owned_ranges.h) and, for an optimizer that
    // steps whole matrices, their share of that step (host memory, `count`).
    bool matrix = false;
    const float* direction = nullptr;
    // The backend's memory through which such an optimizer moves a segment's share to and
    // from host memory, in pieces of at most its size (staged; optim/matrix_exchange.h).
    std::span<float> staging;
};

// piece(at, n) over [0, count) in runs of at most staging.size() elements.
template <typename Piece>
void staged(std::size_t count, std::span<float> staging, Piece piece) {
    for (std::size_t at = 0; at < count; at += staging.size())
        piece(at, std::min(staging.size(), count - at));
}

// A state array an optimizer keeps per whole matrix rather than per element (GaLore's
// projected moments and projector): its name and its elements for that matrix.
struct MatrixStateDecl {
    std::string name;
    std::size_t count = 0;
};

class Optimizer {
public:
    virtual ~Optimizer() = default;
    virtual const char* name() const = 0;
    // The state it keeps per parameter beside the master weights, by name ("exp_avg",
    // "exp_avg_sq"): the names checkpoints hold them under.
    virtual const std::vector<std::string>& state_names() const = 0;
    // Which parameters state array k (in state_names' order) is kept for.
    virtual StateGroup state_group(std::size_t /*k*/) const { return StateGroup::all; }
    // A segment's update on the device.
    virtual void update(kernels::Ops& ops, const Segment& s, const Hyper& h) const = 0;
    // Elements [begin, end) of a segment in host memory (optimizer.offload: host), its
    // gradients `grads` fp32 there too, on the calling thread; params unused.
    virtual void update_host(const Segment& s, const float* grads, const Hyper& h,
                             std::size_t begin, std::size_t end) const = 0;

    // An algorithm that steps whole matrices (Muon): before the element updates, each matrix
    // segment gives its input to that step (matrix_input: from its gradients and state, which
    // it advances, into `out`, host memory of `count`; matrix_input_host the same with the
    // state in host memory, optimizer.offload: host, and the gradients `grads` brought there);
    // the pieces are assembled into whole matrices (optim/matrix_exchange.h), each stepped
    // once by one rank (matrix_step, in place, `m` (rows, cols): output features × input
    // features, in host memory; its products may go through `ops`, in `scratch`, the
    // backend's memory of matrix_scratch(rows, cols) floats at least), and the result handed
    // back to each segment as its `direction` (host memory). Until then update sees no
    // direction. The state an algorithm keeps per matrix (matrix_states, for a (rows, cols)
    // matrix) is held by the rank that steps it and handed to matrix_step in matrix_states'
    // order, in host memory.
    virtual bool whole_matrices() const { return false; }
    virtual void matrix_input(kernels::Ops& /*ops*/, const Segment& /*s*/, const Hyper& /*h*/,
                              float* /*out*/) const {}
    virtual void matrix_input_host(const Segment& /*s*/, const float* /*grads*/, const Hyper& /*h*/,
                                   float* /*out*/) const {}
    virtual std::vector<MatrixStateDecl> matrix_states(std::size_t /*rows*/,
                                                       std::size_t /*cols*/) const {
        return {};
    }
    virtual void matrix_step(kernels::Ops& /*ops*/, float* /*m*/, std::size_t /*rows*/,
                             std::size_t /*cols*/, std::span<float* const> /*state*/,
                             const Hyper& /*h*/, std::span<float> /*scratch*/) const {}
    // The backend's memory (floats) its whole-matrix work needs for a (rows, cols) matrix: the
    // step's scratch, and at least one element to stage the segments' shares through.
    virtual std::size_t matrix_scratch(std::size_t /*rows*/, std::size_t /*cols*/) const {
        return 0;
    }
    // The FLOPs of one matrix_step on a (rows, cols) matrix: optimizer work, which the
    // planner counts in the step's time and never as model FLOPs.
    virtual double matrix_step_flops(std::size_t /*rows*/, std::size_t /*cols*/) const { return 0; }
};

// The optimizer the config asks for (optimizer.name; AdamW's training.beta1, beta2, eps).
std::unique_ptr<Optimizer> make_optimizer(const config::TrainingConfig& t,
                                          const config::OptimizerConfig& o);

// The name the fp32 master weights are kept under beside an optimizer's state.
inline constexpr const char* kMaster = "master";

// A rank's optimizer state on the host, as checkpoints keep it: for each name (kMaster, then
// the optimizer's state_names) a vector of the buffer's size holding the elements this rank
// owns (zero elsewhere); the per-matrix state of the matrices it steps (matrix_states), whole,
// by "NAME/TENSOR" (a state's name, a tensor's whole-model name); and the updates taken.
struct OptimizerState {
    int step = 0;
    std::vector<std::string> names;
    std::vector<std::vector<float>> values;  // per name
    std::map<std::string, std::vector<float>> matrices;
};

}  // namespace trident::optim
