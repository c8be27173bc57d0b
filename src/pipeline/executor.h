// The pipeline executor: walks one stage's instruction stream (schedule.h) for a step,
// running the model's chunks and moving activations and gradients between stages over the
// pipeline group. It knows nothing about schedules: any valid stream runs.
//
// Memory is bounded whatever the number of microbatches: a received message is freed by the
// compute that reads it, and outgoing messages are computed into a pool of kSendBuffers
// buffers, each free again once its send has completed; a compute that finds them all taken
// waits for the first of its sends to complete. The simulator (simulator.h, send_buffers)
// proves every schedule deadlock-free with this pool; it costs nothing while a message's
// latency is small next to a chunk's compute.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <span>
#include <tuple>
#include <vector>

#include "io/chrome_trace.h"
#include "kernels/ops.h"
#include "model/gpt.h"
#include "parallel/comm.h"
#include "pipeline/schedule.h"

namespace trident::pipeline {

class Executor {
public:
    // Fills the token ids of microbatch mb: inputs and targets (B, T), on the host; T is the
    // model's local_tokens() (this context-parallel rank's tokens of each sequence).
    using MicrobatchFn =
        std::function<void(int mb, std::span<int32_t> inputs, std::span<int32_t> targets)>;
    using SeedFn = std::function<uint64_t(int mb)>;

    // `pipeline`: the stage's pipeline group (rank = stage).
    Executor(kernels::Ops& ops, model::Gpt& model, parallel::Comm& pipeline);

    // Runs `stream`. Each token's loss is weighted by dloss in backward. Returns the sum of
    // the mean losses of the microbatches whose loss this stage computed (the last stage's
    // forwards of its last chunk), 0 on other stages.
    double run(const std::vector<Instr>& stream, const MicrobatchFn& microbatch, float dloss,
               bool training, const SeedFn& dropout_seed);
    // Records a span per instruction into `trace` while it records (null: none).
    void set_trace(io::TraceRecorder* trace) { trace_ = trace; }

    // Outgoing buffers of a stage: what the interleaved schedule needs at least (1F1B and
    // GPipe need 1), and the planner counts.
    static constexpr int kSendBuffers = 2;

private:
    using Key = std::tuple<int, int, int>;  // (what, microbatch, local chunk)

    // One outgoing buffer: taken from the compute that fills it until its send completes.
    struct SendSlot {
        kernels::DeviceBuffer buffer;
        parallel::Request sent;
        bool taken = false;
        int peer = -1;  // of the send under way
    };

    kernels::Ptr received(int kind, int mb, int c);  // a received message's buffer
    // A free outgoing buffer for the output of (kind, mb, c), waiting for a send if none is.
    kernels::Ptr take_send_buffer(int kind, int mb, int c);
    // Sends the output of (kind, mb, c) to the stage holding global chunk to_chunk.
    void send(int kind, int mb, int c, int to_chunk, int tag);
    int tag(int kind, int mb, int boundary) const;

    kernels::Ops& ops_;
    model::Gpt& model_;
    parallel::Comm& pipeline_;
    std::vector<int32_t> inputs_, targets_;  // (B, T) of the microbatch at hand
    // Received activations and gradients until their compute, by (kind, mb, chunk).
    std::map<Key, kernels::DeviceBuffer> received_;
    std::vector<SendSlot> send_slots_;  // allocated with the first, kept for later steps
    std::map<Key, int> outgoing_;       // computed, not yet sent: the slot it is in
    std::deque<int> sending_;           // slots with a send under way, oldest first
    io::TraceRecorder* trace_ = nullptr;
};

// The stream of a forward-only pass (validation) over m microbatches.
std::vector<Instr> forward_only(const model::StagePlan& plan, int m);

}  // namespace trident::pipeline
