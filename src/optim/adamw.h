// AdamW with global-norm gradient clipping over the model's flat buffers, sharded over the
// data-parallel group (ZeRO stages 1, 2 and 3).
//
// Numerics follow torch.optim.AdamW (bias-corrected moments, decoupled weight decay) and
// torch.nn.utils.clip_grad_norm_ (scale by max/(norm + 1e-6) when the norm exceeds max).
// Decay applies to weight matrices and embeddings only; the layout says which ranges.
//
// Data parallelism: the gradient buffer (padded so it splits evenly over the D replicas) is
// summed over the data group in buckets of bucket_size parameters, taken from the end of the
// buffer back (backward order: the last layers' gradients are complete first, so their
// reduction can overlap the rest of the backward pass): all-reduced (zero_stage 0: every
// replica then updates the whole stage), or reduce-scattered (zero_stage 1). Under ZeRO-1
// replica r owns the r-th contiguous D-th of every bucket, holds the fp32 master weights and
// Adam's moments of what it owns only (12 bytes per parameter / D), updates it, and the
// buckets are all-gathered back into every replica's parameters. With one
// bucket the shard is one contiguous range. Communication is the same either way:
// reduce-scatter + all-gather moves what an all-reduce moves.
//
// ZeRO-2 and 3: the buckets are the layout's units (the embedding, each layer, ln_f, each
// padded to a multiple of D) and replica r owns the r-th D-th of each, as above; but the
// gradients, and at stage 3 the parameters, live sharded (model/flat_buffer.h): the
// backward's gradients are reduce-scattered unit by unit into the shard, and at stage 3 the
// parameters are gathered unit by unit for the forward and the backward, by ZeroUnits
// (optim/zero_units.h), to which the hooks below go. The update reads the gradient shard
// and writes the parameters' (stage 3) or the whole parameters, which stage 2 all-gathers
// back as stage 1 does.
//
// Overlap (Megatron's overlap_grad_reduce and overlap_param_gather). Between
// start_step and reduce_gradients the model announces the ranges of the gradient buffer that
// are final (grads_final), and a bucket all of whose gradients are final starts its
// reduction (all-reduce or reduce-scatter) at once, under the rest of the backward pass;
// reduce_gradients starts any bucket not started and waits for all. After the update each bucket's
// all-gather starts and step() returns; the next forward waits for a bucket just before it reads
// parameters of it (params_needed), and anything else that reads or writes the parameters first
// calls finish_param_gather (zero_stage 1; stage 0 has no gather). The calls are the blocking ones'
// (Comm's non-blocking forms), so the results are bitwise those without overlap.
//
// Mixed precision: the parameters and gradients may be 16-bit; the master weights and the
// moments are fp32 always, and each update writes the master weights, rounded, back into
// the parameters in the same pass.
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
#include "io/chrome_trace.h"
#include "kernels/ops.h"
#include "model/flat_buffer.h"
#include "model/gpt.h"
#include "model/param_layout.h"
#include "optim/zero_units.h"
#include "parallel/comm.h"
#include "parallel/solo_comm.h"

namespace trident::optim {

// The process groups the optimizer reduces over (null: not split along that axis).
struct OptimizerGroups {
    parallel::Comm* tensor = nullptr;
    parallel::Comm* pipeline = nullptr;
    parallel::Comm* data = nullptr;
};

// What the data-parallel communication overlaps (see the top of this file).
struct Overlap {
    bool grad_reduce = false;   // the reductions with the backward pass
    bool param_gather = false;  // the all-gathers with the next forward pass (ZeRO-3: prefetch)
};

class AdamW {
public:
    // `params` and `grads`: the model's buffers (whole, or sharded by units at stages 2 and
    // 3), of the layout's total padded to a multiple of the data-parallel size. The master
    // weights start as the parameters at the first step, so the model may be initialised or
    // loaded until then.
    AdamW(kernels::Ops& ops, const model::ParamLayout& layout, const config::TrainingConfig& cfg,
          const OptimizerGroups& groups, int zero_stage, model::FlatBuffer& params,
          model::FlatBuffer& grads, std::size_t bucket_size = SIZE_MAX, Overlap overlap = {});

    // A step's gradients begin: from now until reduce_gradients, grads_final starts the
    // reduction of each bucket (stages 2, 3: unit) it completes.
    void start_step();
    // The model's hooks (model::Gpt::StepHooks).
    void grads_needed(std::size_t begin, std::size_t end);
    void grads_final(std::size_t begin, std::size_t end);
    // Sums the gradients over the data group: all of them (stage 0) or this rank's shard
    // (stage 1, into its place in the gradients; stages 2, 3: the gradient shard).
    void reduce_gradients();
    // Before the parameters of [begin, end) are read: their buckets' gathers have completed
    // (stage 3: their units are gathered).
    void params_needed(std::size_t begin, std::size_t end);
    void params_prefetch(std::size_t begin, std::size_t end);
    void params_done(std::size_t begin, std::size_t end);
    // Every gather under way completed: the parameters may be read or written anywhere.
    void finish_param_gather();
    // Records the data-parallel calls' spans (launch to observed completion) while it does.
    void set_trace(io::TraceRecorder* trace);
    // Global L2 norm of the reduced gradients; collective over the grid, the same on every
    // rank, and inf or NaN on every rank if any gradient anywhere is.
    double grad_norm() const;
    // The factor that clips gradients of this norm to the configured one (1: not clipped).
    float clip_factor(double norm) const;
    // One update with learning rate lr on the gradients times grad_scale (unscaling and
    // clipping): the shard's master weights, then the parameters made whole again on every
    // replica (stage 3: the parameters' shard). Advances the step count.
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
    // The parameters' gather must have finished (finish_param_gather).
    State state() const;
    // The reverse, from a State of this buffer layout (only the owned elements are read);
    // the next update continues from it instead of taking the parameters.
    void restore(const State& state);
    // The parameters as an update leaves them: the master weights of what this rank owns,
    // rounded to the parameters' type, made whole on every replica (stage 3: in the shard).
    // Collective over the data group.
    void params_from_master();
    // The parts of the buffer this rank owns: (offset, count) in buffer order.
    std::vector<std::pair<std::size_t, std::size_t>> owned_ranges() const;
    // Elements of the buffer this rank updates, and the bytes of optimizer state it holds
    // for them (fp32 master weights, m and v) as the allocator counted them.
    std::size_t state_bytes() const { return state_bytes_; }

private:
    // A bucket of the buffer and this rank's part of it.
    struct Bucket {
        std::size_t begin, size;  // in the buffer
        std::size_t mine;         // offset of this rank's part (size / D floats, or all)
        std::size_t state;        // where that part's master weights and moments start
    };
    struct Range {
        std::size_t offset, count;
        std::size_t state;  // offset in the master weights and moments
        bool decay;
        bool counted;  // in the norm on this rank (held once here, not a copy)
    };

    // A bucket's data-parallel calls under way in this step.
    struct InFlight {
        std::size_t final = 0;  // gradients of the bucket announced final
        bool reducing = false;  // its reduce-scatter started
        parallel::Request reduction, gather;
        double reduction_start = 0, gather_start = 0;  // for the trace, in microseconds
    };

    std::size_t owned_part(const Bucket& b) const;  // floats of the bucket this rank updates
    // Every replica's updated part into every replica (zero_stages 1, 2; in place), all at once.
    void gather_params();
    bool gathers_after_update() const { return zero_stage_ == 1 || zero_stage_ == 2; }
    void start_reduction(std::size_t bucket);
    // Notes which calls under way have completed (their spans end now).
    void poll();
    void finish_reduction(std::size_t bucket);
    void finish_gather(std::size_t bucket);

    kernels::Ops& ops_;
    config::TrainingConfig cfg_;
    model::FlatBuffer& params_;
    model::FlatBuffer& grads_;
    parallel::SoloComm solo_;
    parallel::Comm& tensor_;
    parallel::Comm& pipeline_;
    parallel::Comm& data_;
    int zero_stage_;
    std::size_t size_;             // floats in the buffers
    std::size_t layout_total_;     // of them, the tensors' (the rest is padding)
    std::vector<Bucket> buckets_;  // in buffer order
    std::size_t owned_ = 0;        // floats this rank updates
    std::vector<Range> ranges_;    // maximal runs of tensors alike, cut to what this rank owns
    kernels::DeviceBuffer master_, m_, v_;  // fp32 master weights and Adam's moments (owned)
    kernels::DeviceBuffer norm_total_;      // (1) f64: the squared gradient norm, on the device
    std::size_t state_bytes_ = 0;
    int step_ = 0;  // the master weights are taken from the parameters before step 1

    Overlap overlap_;                   // as asked, where it applies (D > 1)
    std::vector<InFlight> flight_;      // per bucket
    bool in_step_ = false;              // between start_step and reduce_gradients (overlapped)
    std::unique_ptr<ZeroUnits> units_;  // stages 2, 3
    io::TraceRecorder* trace_ = nullptr;
};

}  // namespace trident::optim
