// The shapes the planner's models share: one rank's sizes of a microbatch (as model/gpt.cpp
// sizes its buffers), the chunks a pipeline stage runs, and what its schedule keeps in flight
// (walked from the schedule's own instruction stream, as the executor walks it).
#pragma once

#include <cstdint>
#include <vector>

#include "config/config.h"
#include "pipeline/schedule.h"

namespace trident::plan {

// One rank's share of one microbatch, in elements.
struct RankDims {
    int64_t B = 0, T = 0;  // micro batch, sequence
    int64_t N = 0;         // rows of a microbatch, B·T
    int64_t R =
        0;  // rows of the residual stream on this rank: N/M with sequence parallelism, else N
    int64_t C = 0;      // hidden
    int64_t Cm = 0;     // attention width on this rank, C/M
    int64_t Fm = 0;     // MLP width on this rank, F/M
    int64_t heads = 0;  // heads on this rank, NH/M
    int64_t vocab = 0;  // padded vocabulary on this rank, Vp/M
    bool sequence_parallel = false;

    int64_t attention() const { return B * heads * T * T; }             // (B, NH/M, T, T)
    int64_t all_rows() const { return sequence_parallel ? N * C : 0; }  // all-gathered copies
};
RankDims rank_dims(const config::Config& cfg);

// A local chunk of a stage: its layers, and whether it starts with the embedding (global chunk
// 0) or ends with the LM head and the loss (the last global chunk).
struct ChunkShape {
    int layers = 0;
    bool embeds = false;
    bool head = false;
};
std::vector<ChunkShape> stage_chunks(const config::Config& cfg, int stage);

// GEMM FLOPs one rank executes for one microbatch: a layer's forward and backward (what
// recompute reruns included: full reruns the forward up to the GELU, selective the
// attention scores), and the LM head's (logits (N, Vp/M) and their gradients). Causal
// attention counts at half, as kernels that skip the masked blocks run it.
struct GemmFlops {
    double layer_forward = 0, layer_backward = 0;
    double head_forward = 0, head_backward = 0;
    // Of the backwards, the weight gradients' GEMMs (a split backward's W).
    double layer_weight = 0, head_weight = 0;
};
GemmFlops gemm_flops(const config::Config& cfg);

pipeline::Kind schedule_kind(const config::Config& cfg);

// What a stage's instruction stream for one step keeps at once, at most.
struct InFlight {
    std::vector<int>
        sets;          // per local chunk: activation sets held (the model pools them per chunk)
    int messages = 0;  // the executor's boundary buffers, (R, C) each: received, and its pool
};
InFlight in_flight(const config::Config& cfg, int stage);

}  // namespace trident::plan
