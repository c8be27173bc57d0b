// The pipeline executor: walks one stage's instruction stream (schedule.h) for a step,
// running the model's chunks and moving activations and gradients between stages over the
// pipeline group. It knows nothing about schedules: any valid stream runs.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <tuple>
#include <vector>

#include "io/chrome_trace.h"
#include "kernels/ops.h"
#include "model/gpt.h"
#include "parallel/comm.h"
#include "parallel/solo_comm.h"
#include "pipeline/schedule.h"

namespace trident::pipeline {

class Executor {
public:
    // Fills the token ids of microbatch mb: inputs and targets (B, T), on the host.
    using MicrobatchFn =
        std::function<void(int mb, std::span<int32_t> inputs, std::span<int32_t> targets)>;
    using SeedFn = std::function<uint64_t(int mb)>;

    // `pipeline`: the stage's pipeline group (rank = stage), or null for one stage.
    Executor(kernels::Ops& ops, model::Gpt& model, parallel::Comm* pipeline);

    // Runs `stream`. Each token's loss is weighted by dloss in backward. Returns the sum of
    // the mean losses of the microbatches whose loss this stage computed (the last stage's
    // forwards of its last chunk), 0 on other stages.
    double run(const std::vector<Instr>& stream, const MicrobatchFn& microbatch, float dloss,
               bool training, const SeedFn& dropout_seed);
    // Records a span per instruction into `trace` while it records (null: none).
    void set_trace(io::TraceRecorder* trace) { trace_ = trace; }

private:
    using Key = std::tuple<int, int, int>;  // (what, microbatch, local chunk)

    kernels::Ptr buffer(int kind, int mb, int c);
    void drop(int kind, int mb, int c);
    int tag(int kind, int mb, int boundary) const;

    kernels::Ops& ops_;
    model::Gpt& model_;
    parallel::SoloComm solo_;
    parallel::Comm& pipeline_;
    std::vector<int32_t> inputs_, targets_;  // (B, T) of the microbatch at hand
    // Activations and gradients between receive/compute/send, by (kind, mb, chunk).
    std::map<Key, model::DeviceBuffer> messages_;
    io::TraceRecorder* trace_ = nullptr;
};

// The stream of a forward-only pass (validation) over m microbatches.
std::vector<Instr> forward_only(const model::StagePlan& plan, int m);

}  // namespace trident::pipeline
