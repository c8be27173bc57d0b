// The shapes the planner's models share: the chunks a pipeline stage runs, and what its
// schedule keeps in flight (walked from the schedule's own instruction stream, as the executor
// walks it). One rank's sizes of a microbatch are the model's own (config::rank_dims,
// model/dims.h).
#pragma once

#include <cstdint>
#include <vector>

#include "config/config.h"
#include "pipeline/schedule.h"

namespace trident::plan {

// A local chunk of a stage: its layers, and whether it starts with the embedding (global chunk
// 0) or ends with the LM head and the loss (the last global chunk).
struct ChunkShape {
    int layers = 0;
    bool embeds = false;
    bool head = false;
};
std::vector<ChunkShape> stage_chunks(const config::Config& cfg, int stage);
// The same for a schedule of P stages and v chunks each, its global chunks holding
// `chunk_layers` layers.
std::vector<ChunkShape> stage_chunks(pipeline::Kind kind, int P, int v,
                                     const std::vector<int>& chunk_layers, int stage);
// The same into `chunks`, its storage reused.
void stage_chunks(pipeline::Kind kind, int P, int v, const std::vector<int>& chunk_layers,
                  int stage, std::vector<ChunkShape>& chunks);

// What a stage's instruction stream for one step keeps at once, at most.
struct InFlight {
    std::vector<int>
        sets;          // per local chunk: activation sets held (the model pools them per chunk)
    int messages = 0;  // the executor's boundary buffers, (R, H) each: received, and its pool
};
// Every stage's, stage by stage, for the schedule `kind` of P stages, v chunks each and m
// microbatches.
std::vector<InFlight> in_flight(pipeline::Kind kind, int P, int v, int m);
// The config's schedule's.
std::vector<InFlight> in_flight(const config::Config& cfg);

}  // namespace trident::plan
