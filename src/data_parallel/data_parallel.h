// Data parallelism over the replicas holding the same weights (the data-context group of D·C
// ranks, docs/ARCHITECTURE.md "Grid order"): the one place that knows ZeRO's stages, hybrid
// sharding and the parameters' offload. It decides how the model holds its buffers
// (buffer_plan), listens to the model's events on its units (model/model_units.h), decides
// which part of the trainable buffer each replica owns, and moves the bytes that sum the
// gradients over the replicas and make the parameters whole again after an update. The
// optimizer (src/optim/optimizer.h) updates what this rank owns, and nothing else, as
// Megatron-Core keeps distributed/ apart from its optimizer.
//
// Buckets. The gradient buffer (padded so it splits evenly over the D replicas) is summed in
// buckets of bucket_size parameters, taken from the end of the buffer back (backward order:
// the last layers' gradients are complete first, so their reduction can overlap the rest of
// the backward pass): all-reduced (ZeRO-0: every replica then owns, and updates, everything),
// or reduce-scattered (ZeRO-1): replica r owns the r-th contiguous D-th of every bucket, and
// after the update the buckets are all-gathered back into every replica's parameters. With one
// bucket the owned part is one contiguous range. Reduce-scatter + all-gather moves what an
// all-reduce moves.
//
// ZeRO-2 and 3 (Rajbhandari et al., arXiv 1910.02054, §5): the buckets are the layout's units
// (the embedding, each layer, ln_f, each padded to a multiple of D) and replica r owns the
// r-th D-th of each, as above; but the gradients, and at stage 3 the parameters, live sharded
// (model/flat_buffer.h): the backward's gradients are reduce-scattered unit by unit into the
// shard, and at stage 3 the parameters gathered unit by unit for the forward and the backward,
// by ZeroUnits (zero_units.h), to which the model's unit events go (model/model_units.h).
// Stage 2 all-gathers the updated units as stage 1 its buckets; stage 3 updates its shard and
// gathers nothing then.
//
// Hybrid sharding (parallel.data_shard: N; docs/ARCHITECTURE.md, "Hybrid sharding"). The
// group above is then the shard group of N ranks, and the D·C/N shard groups are replicas of
// one another: after the reductions within the shard group, each rank's owned parts (its
// share of the sum over its shard group) are all-reduced over the replica group (the ranks
// with the same part in every shard group), once a step, so every shard group holds the sum
// over all D·C. With N = D·C the replica group is this rank alone and nothing more moves.
//
// Experts split (parallel.expert: E; docs/ARCHITECTURE.md, "Mixture of experts"). Each rank
// holds only its experts of each MoE layer, in one run per layer (model/param_layout.h,
// expert_runs) at the same offsets on every rank of the expert group, so the runs of the buffer
// mean other experts on the group's other ranks. A run is its own buckets (at ZeRO 2 and 3 its
// own unit, model/flat_buffer.h), summed, sharded and gathered over the expert-shard group (the
// ranks of the shard group holding the same experts: the D·C/E of the expert-data group, or
// with hybrid sharding its N/E within the run) as the rest of the buffer is over the shard
// group. With hybrid sharding a replica partner (same place in another run) holds the same
// experts and owns the same part of them (E divides N; parallel/grid.h), so the replica
// group's all-reduce of the owned parts sums the experts' too.
//
// A frozen model (low-rank adapters) trains its adapters: the trainable buffer is theirs, and at
// ZeRO-3 the frozen model's own parameters are sharded too, each unit gathered for the forward
// and the backward and released, never reduced (a gather-only ZeroUnits of their own). A 4-bit
// base's quantized bytes (model/nf4_base.h), sharded by the same units, are a second
// gather-only set: a layer's codes and constants gathered on the same events, not its
// dequantized weights.
//
// A pipeline's tied embedding (ModelUnit::shared): the first and the last stage each hold a
// copy whose gradient is half the sum. Whole gradients are summed over the embedding group after
// the schedule's last backward (backward_done), before their reduction starts; sharded ones
// after the reduction, on the shards.
//
// Overlap (Megatron's overlap_grad_reduce and overlap_param_gather). Between start_step and
// reduce_gradients the model announces the units whose gradients are complete
// (grads_complete), and a bucket all of whose gradients are final starts its reduction at once,
// under the rest of the backward pass; reduce_gradients starts any bucket not started and
// waits for all. After the update each bucket's all-gather starts (gather_updated); the next
// forward waits for a bucket just before it reads parameters of it (params_needed), and
// anything else that reads or writes the parameters first calls finish_param_gather. The
// calls are the blocking ones' non-blocking forms (parallel/comm.h), issued in the same order
// on every replica, so the results are bitwise those without overlap.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "data_parallel/zero_units.h"
#include "io/chrome_trace.h"
#include "kernels/ops.h"
#include "model/flat_buffer.h"
#include "model/model_units.h"
#include "model/param_layout.h"
#include "parallel/comm.h"

namespace trident::data_parallel {

// What the data-parallel communication overlaps (see the top of this file).
struct Overlap {
    bool grad_reduce = false;   // the reductions with the backward pass
    bool param_gather = false;  // the all-gathers with the next forward pass (ZeRO-3: prefetch)
};

// ZeRO-3: a unit's gathered parameters released after each use (true), or kept until
// release_params (false; config.h, parallel.reshard_after_forward).
struct Resharding {
    bool after_use = true;
};

// A part of the buffers this rank owns, and where its optimizer state starts (the state of
// the owned parts, in buffer order, one after another).
struct OwnedPart {
    std::size_t offset = 0, count = 0;
    std::size_t state = 0;
};

// A run of the trainable buffer reduced and gathered at once, and this replica's part of it.
struct Bucket {
    std::size_t begin, size;  // in the buffer
    std::size_t mine, owned;  // this replica's part: its offset and elements (size / D, or all)
    bool experts = false;     // a run of the experts held: over the expert-shard group
};

// The runs of the experts a rank holds (model::ParamLayout::expert_runs) and its place in the
// expert-shard group, of `ranks` ranks, that sums and shards them.
struct ExpertRuns {
    std::vector<std::pair<std::size_t, std::size_t>> runs;
    std::size_t ranks = 1, rank = 0;
};

// The buckets of a trainable buffer of `size` elements (a multiple of D) for replica r of D
// at ZeRO stage `zero_stage`: at stages 2 and 3 the units' trainable ranges, else runs of
// max(D, bucket_size / D·D) elements counted from the end; either cut where `experts`' runs
// (multiples of D) begin and end, theirs over its ranks; replica r owns the r-th D-th of
// each at stages 1-3 (of an experts' run, the expert-shard rank's share), all of it at stage 0.
std::vector<Bucket> make_buckets(const std::vector<model::ModelUnit>& units, std::size_t size,
                                 int zero_stage, std::size_t D, std::size_t r,
                                 std::size_t bucket_size, const ExpertRuns& experts = {});
// What those buckets give their replica to own, in buffer order (DataParallel::owned).
std::vector<OwnedPart> owned_parts(const std::vector<Bucket>& buckets);

// Sees each range of the gradients once it is final, before any reduction sums it
// (train/first_sighting.h).
class GradientObserver {
public:
    virtual ~GradientObserver() = default;
    virtual void grads_final(kernels::Ptr grads, std::size_t count) = 0;
};

// How the model holds its buffers at ZeRO stage `zero_stage` over the `shard` group: padded to
// its size, and (stages 2, 3) sharded by units, a run of the experts held over `expert_shard`;
// `sharded_accumulation`: a sharded gradient reduced after every microbatch
// (parallel.sharded_accumulation).
model::BufferPlan buffer_plan(int zero_stage, const parallel::Comm& shard,
                              const parallel::Comm& expert_shard, bool sharded_accumulation);

// The model as the module sees it: its units, its trainable buffers (the model's own, or a
// frozen model's adapters') and a frozen model's own parameters.
struct ModelBuffers {
    std::vector<model::ModelUnit> units;
    model::FlatBuffer& params;
    model::FlatBuffer& grads;
    std::size_t tensors = 0;  // elements of the trainable layout (past them: padding)
    // The runs of the experts held, where the experts are split (model/param_layout.h).
    std::vector<std::pair<std::size_t, std::size_t>> expert_runs;
    model::FlatBuffer* frozen = nullptr;
    model::FlatBuffer* codes = nullptr;  // a 4-bit base's bytes (Nf4Base::codes), or null
};

// The groups: `shard` the one the state is sharded over, `replicas` its replicas (hybrid
// sharding; this rank alone without), `embedding` the stages sharing a tied embedding,
// `expert_shard` the one the runs of the experts held are summed and sharded over (then summed
// over `replicas` too).
struct DataGroups {
    parallel::Comm& shard;
    parallel::Comm& replicas;
    parallel::Comm& embedding;
    parallel::Comm& expert_shard;
};

struct DataParallelOptions {
    int zero_stage = 1;
    std::size_t bucket_size = 0;
    Overlap overlap;
    Resharding resharding;
};

class DataParallel final : public model::UnitListener {
public:
    // `param_file`: ZeRO-3's shard of the parameters in a file (optimizer.offload_params), or
    // null.
    DataParallel(kernels::Ops& ops, ModelBuffers model, DataGroups groups,
                 const DataParallelOptions& options, ParamFile* param_file = nullptr);

    int zero_stage() const { return zero_stage_; }
    parallel::Comm& group() const { return group_; }
    // The group the runs of the experts held are summed and sharded over (DataGroups).
    parallel::Comm& expert_group() const { return expert_shard_; }
    // What this rank owns (and the optimizer updates), in buffer order.
    const std::vector<OwnedPart>& owned() const { return owned_; }
    std::size_t owned_count() const { return owned_count_; }
    // The parts of the buffer this rank owns: (offset, count) in buffer order.
    std::vector<std::pair<std::size_t, std::size_t>> owned_ranges() const;
    // Where final gradients are shown before their reduction (none: nowhere).
    void observe(GradientObserver* observer) { observer_ = observer; }

    // A step's gradients begin: from now until reduce_gradients, grads_complete starts the
    // reduction of each bucket (stages 2, 3: unit) it completes.
    void start_step();
    // The model's events (model::UnitListener).
    void params_needed(std::size_t unit, const std::size_t* next) override;
    void params_done(std::size_t unit) override;
    void grads_needed(std::size_t unit) override;
    void grads_complete(std::size_t unit) override;
    // After the schedule's last backward: whole gradients of a tied embedding summed with the
    // other stage's copy and announced.
    void backward_done();
    // After a run of the schedule (stage 3): the units kept gathered released.
    void release_params();
    // Outside a step, fn(unit) for each unit in order, a 4-bit base's bytes of it resident:
    // gathered for the call and released after at stage 3 (collective over the shard group),
    // whole below it. What reads the whole base (Nf4Base::fill) reads it so.
    void with_codes_gathered(const std::function<void(const model::ModelUnit&)>& fn);
    // Sums the gradients over the group and its replicas: all of them (stage 0) or this
    // rank's owned parts (stage 1: in their places in the gradients; stages 2, 3: the
    // gradient shard); sharded, then the tied embedding's two copies on the shards.
    void reduce_gradients();
    // After an update of the owned parts: the parameters made whole on every replica again
    // (stages 1, 2), overlapped with the next forward when asked; stage 3 gathers each unit as
    // it is needed.
    void gather_updated();
    // The same, finished before it returns.
    void gather_params();
    // Every gather under way completed: the parameters may be read or written anywhere.
    void finish_param_gather();
    // Records the calls' spans (launch to observed completion) while it records.
    void set_trace(io::TraceRecorder* trace);
    // ZeRO-3's parameter shard in a file (optimizer.offload_params): the gathers read from it.
    void set_param_file(ParamFile* file);
    ParamFile* param_file() const { return param_file_; }

private:
    // A bucket's calls under way in this step.
    struct InFlight {
        std::size_t final = 0;  // gradients of the bucket announced final
        bool reducing = false;  // its reduction started
        parallel::Request reduction, gather;
        double reduction_start = 0, gather_start = 0;  // for the trace, in microseconds
    };

    // The trainable buffer's side of the events, on a range of it.
    void range_needed(std::size_t begin, std::size_t end);
    void range_final(std::size_t begin, std::size_t end);
    // The final range shown to the observer, where it is resident.
    void show(std::size_t begin, std::size_t end);
    void tie_sharded();
    bool gathers_after_update() const { return zero_stage_ == 1 || zero_stage_ == 2; }
    // The group a bucket is summed, sharded and gathered over.
    parallel::Comm& group_of(const Bucket& b) const { return b.experts ? expert_shard_ : group_; }
    void start_reduction(std::size_t bucket);
    // Notes which calls under way have completed (their spans end now).
    void poll();
    void finish_reduction(std::size_t bucket);
    void finish_gather(std::size_t bucket);
    // The owned parts' sums over the shard group summed over the replica group.
    void sum_over_replicas();
    // The completed call's span in the trace: when and where its data moved (Request::Transfer),
    // `issued` when it was asked for.
    void end_span(io::SpanKind kind, std::size_t bucket, const parallel::Request& done,
                  double issued) const;

    std::vector<model::ModelUnit> units_;
    model::FlatBuffer& params_;
    model::FlatBuffer& grads_;
    parallel::Comm& group_;
    parallel::Comm& replicas_;
    parallel::Comm& embedding_;
    parallel::Comm& expert_shard_;
    int zero_stage_;
    std::size_t layout_total_;     // of the buffer's elements, the tensors' (the rest is padding)
    std::vector<Bucket> buckets_;  // in buffer order
    std::vector<OwnedPart> owned_;
    std::size_t owned_count_ = 0;
    Overlap overlap_;                        // as asked, where it applies (D > 1)
    std::vector<InFlight> flight_;           // per bucket
    bool in_step_ = false;                   // between start_step and reduce_gradients (overlapped)
    std::unique_ptr<ZeroUnits> zero_units_;  // stages 2, 3
    // At stage 3, what is gathered unit by unit and never reduced: a frozen model's own
    // parameters and a 4-bit base's bytes, each unit's range in it the ModelUnit's `range`.
    struct GatherOnly {
        model::UnitRange model::ModelUnit::*range;
        std::unique_ptr<ZeroUnits> units;
    };
    std::vector<GatherOnly> gather_only_;
    model::FlatBuffer no_grads_;         // the frozen model's (it has none)
    std::vector<std::size_t> deferred_;  // whole shared units, complete before their tie
    GradientObserver* observer_ = nullptr;
    ParamFile* param_file_ = nullptr;
    io::TraceRecorder* trace_ = nullptr;
};

}  // namespace trident::data_parallel
