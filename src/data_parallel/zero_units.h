// ZeRO-2 and ZeRO-3's data-parallel exchange, unit by unit (Rajbhandari et al., arXiv
// 1910.02054, §5; PyTorch FSDP's pattern), on the model's sharded buffers
// (model/flat_buffer.h; the units are the layout's: the embedding, each layer, ln_f).
//
// Gradients (ZeRO-2 and 3). Before the backward adds into a unit's gradients it asks for them
// (grads_needed): the unit's whole is allocated, zeroed. Once the unit's gradients are final
// for now (grads_final: after every microbatch's backward, or only after the step's last when
// whole gradients are kept until then), its reduce-scatter starts, in place: replica r's part
// of the sum lands in the r-th part of the unit; finishing it adds that part into the shard
// (which the step starts at zero) and releases the unit. With overlap_grad_reduce the
// reduce-scatter runs under the rest of the backward and is finished at fixed points: at most
// two run at once (starting a third finishes the oldest), a unit's reduction is finished
// before its gradients are allocated again, and before any unit's are allocated every
// reduction but the newest is finished. So which units are resident at each point of a step
// does not depend on timing (the planner counts the shards, not these units). Without
// overlap each reduction is finished where it starts.
//
// Parameters (ZeRO-3). The shard holds this replica's parts; a unit's whole is gathered
// (all-gather of every replica's part, into a freshly allocated unit) when the model asks
// for it (params_needed, which waits for it) or, with overlap_param_gather, when the model
// says it comes next (params_prefetch: the gather runs under the current unit's compute), and
// released when the model is done with it (params_done). The working copy of the whole model
// never exists at once: at most the units the model holds between needed and done, and the
// one prefetched. Without resharding after use (parallel.reshard_after_forward false) a unit
// stays gathered from its first use in a pass of the schedule until release_params, after
// the schedule's last backward: one gather per unit and step instead of one per forward and
// backward of every microbatch, the rank's whole parameters resident meanwhile.
//
// With the shard in a file (optimizer.offload_params, param_file.h) each gather's source is
// the unit's part read from the file into a staging buffer, freed once the gather is done;
// params_prefetch starts that read, and the gather too with overlap_param_gather.
//
// The calls are Comm's non-blocking ones, issued in the same order on every replica, so the
// sums are those of the blocking calls.
#pragma once

#include <cstddef>
#include <deque>
#include <vector>

#include "data_parallel/param_file.h"
#include "io/chrome_trace.h"
#include "kernels/ops.h"
#include "model/flat_buffer.h"
#include "parallel/comm.h"

namespace trident::data_parallel {

class ZeroUnits {
public:
    // `params` may be whole (ZeRO-2: the parameter hooks are then not called here); `grads`
    // is sharded, or unused where only the parameter hooks are called (a frozen model's own
    // parameters under low-rank adapters, which have no gradients). `data` is the data-parallel
    // group they are sharded over, `experts` the expert-shard group a unit that is a run of the
    // experts held is (model::UnitShards::experts).
    ZeroUnits(kernels::Ops& ops, model::FlatBuffer& params, model::FlatBuffer& grads,
              parallel::Comm& data, parallel::Comm& experts, bool overlap_reduce,
              bool overlap_gather, bool reshard_after_use);

    void grads_needed(std::size_t begin, std::size_t end);
    void grads_final(std::size_t begin, std::size_t end);
    // Every reduction under way finished: the shard holds the step's sums, no unit of
    // gradients is resident.
    void finish_reductions();

    void params_needed(std::size_t begin, std::size_t end);
    void params_prefetch(std::size_t begin, std::size_t end);
    void params_done(std::size_t begin, std::size_t end);
    // Every gathered unit released (those kept without resharding after use).
    void release_params();

    void set_trace(io::TraceRecorder* trace) { trace_ = trace; }
    // The parameter shard's file (ZeRO-3 with optimizer.offload_params), or null.
    void set_param_file(ParamFile* file) { file_ = file; }

    // At most this many reductions under way at once.
    static constexpr std::size_t kReductionsInFlight = 2;

private:
    struct Pending {
        std::size_t unit;
        parallel::Request request;
        double start = 0;  // for the trace, in microseconds
    };
    // The group unit u of `buffer` is sharded over.
    parallel::Comm& group_of(const model::FlatBuffer& buffer, std::size_t u) const {
        return buffer.shards(u).experts ? experts_ : data_;
    }
    void start_reduction(std::size_t u);
    void finish_reduction(std::size_t u);  // one that is under way
    bool reducing(std::size_t u) const;
    void start_gather(std::size_t u);
    void finish_gather(std::size_t u);
    void free_staging(std::size_t u);  // the part read from the file, once gathered
    // The completed call's span in the trace (see DataParallel::end_span).
    void end_span(io::SpanKind kind, std::size_t u, const parallel::Request& done,
                  double issued) const;

    kernels::Ops& ops_;
    model::FlatBuffer& params_;
    model::FlatBuffer& grads_;
    parallel::Comm& data_;
    parallel::Comm& experts_;
    bool overlap_reduce_, overlap_gather_;
    bool reshard_after_use_;
    std::deque<Pending> reductions_;          // oldest first
    std::vector<parallel::Request> gathers_;  // per unit of the parameters
    std::vector<double> gather_start_;
    ParamFile* file_ = nullptr;
    std::vector<kernels::Ptr> staging_;  // per unit: its part from the file while gathered
    io::TraceRecorder* trace_ = nullptr;
};

}  // namespace trident::data_parallel
