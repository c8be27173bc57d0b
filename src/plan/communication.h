// The traffic of one training step for one rank of each pipeline stage, per process group,
// call by call as Trident makes them (model/gpt.cpp, optim/adamw.cpp, train/trainer.cpp,
// pipeline/executor.cpp):
//   tensor     per layer and microbatch 2 all-reduces of (N, H) forward and 2 backward (one
//              more forward under full recompute, which reruns a layer up to its GELU), plus
//              the embedding's and the LM head's; with sequence parallelism each becomes a
//              reduce-scatter, and the column-parallel GEMMs' inputs are all-gathered
//              (with tp_overlap the split linears' ones in M pieces under their GEMMs).
//   pipeline   each microbatch's activation (R, H) sent to the next stage and its gradient
//              to the previous one, per chunk.
//   embedding  the tied word embedding's gradient, summed between the first and last stage
//              (ZeRO 2: each replica's part of it, once reduced).
//   context    ring attention's keys and values sent around the C ranks, forward and
//              backward, and their fp32 gradients backward; or Ulysses' all-to-alls of q, k,
//              v and the output and of their gradients (docs/FORMULAS.md).
//   data       over the D·C ranks holding the same weights (the data-context group): the
//              gradient buffer all-reduced (ZeRO 0), or reduce-scattered in buckets and the
//              updated weights all-gathered (ZeRO 1); ZeRO 2 the same by units of the
//              layout, their reduce-scatter once per microbatch with sharded accumulation;
//              ZeRO 3 no gather after the update but each unit's weights gathered before the
//              forward and again before the backward of every microbatch (per rank, with
//              m = 1: 3Ψ(D−1)/D sent, against 2Ψ(D−1)/D for stages 0 to 2), or once a step
//              with parallel.reshard_after_forward false (communication.cpp, unit_gathers).
//              With hybrid sharding (parallel.data_shard: N) this is the shard group of N
//              ranks, D above read as N.
//   data-replica  hybrid sharding's D·C/N shard groups: each rank's N-th of every bucket
//              (ZeRO 1) or unit (ZeRO 2, 3) all-reduced across them once a step
//              (docs/FORMULAS.md, "Hybrid sharding").
//   expert     expert parallelism's E ranks (parallel.expert, model/moe_dispatch.h), per MoE
//              layer and microbatch: the forward all-to-alls the counts per expert (N i32 in
//              all), the routed rows (K, H) to their experts' ranks and the outputs (K, H)
//              back; the backward the outputs' gradients there and the inputs' gradients back;
//              full recompute reruns the forward's three. K = rows·top_k, the choices of every
//              row this rank routes (docs/FORMULAS.md, "Expert parallelism's all-to-alls").
// Each group also carries a few scalars a step (loss, gradient norm), counted too, and a
// mixture of experts' losses and loads (2 + L·(N + 1) doubles) over the pipeline and data groups.
//
// Bytes are counted two ways: the payload handed to the calls, as Comm's statistics count
// it (the metrics' tp_*_bytes and dp_*_bytes for fp32 runs), and the bytes each rank sends
// on the links under ring algorithms: all-reduce 2(n−1)/n of its buffer, reduce-scatter
// (n−1)/n of its input, all-gather (n−1)·its contribution.
#pragma once

#include <cstdint>
#include <vector>

#include "parallel/comm.h"
#include "plan/memory_model.h"

namespace trident::plan {

// `calls` calls of one kind, each with `elements` elements of `element_bytes` as Comm counts
// them (all-reduce and send: the buffer; reduce-scatter: the whole input; all-gather: this
// rank's part).
struct Calls {
    parallel::CommKind kind = parallel::CommKind::all_reduce;
    int64_t calls = 0;
    double elements = 0;
    int element_bytes = 4;
    // Whether they happen once per microbatch (on the pipeline's critical path) or once per
    // step (after the last backward).
    bool per_microbatch = false;
    // Steps of a ring that overlap a GEMM's pieces (parallel.tp_overlap, model/tensor_rows.h);
    // 1: a whole collective.
    int pieces = 1;
};

struct GroupTraffic {
    int size = 1;              // ranks in the group; a group of one moves nothing
    std::vector<Calls> calls;  // per step

    int64_t call_count() const;
    double payload_bytes() const;
    double sent_bytes() const;  // by this rank, ring algorithms
};

// The bytes a rank sends on the links for one call of `payload` bytes over n ranks.
double sent_per_call(parallel::CommKind kind, double payload, int n);

struct StageTraffic {
    // kv_replica: the tensor ranks sharing a key/value head when M > KVH (model/param_layout.h).
    GroupTraffic tensor, context, pipeline, embedding, data, kv_replica, data_replica, expert;
    // expert_shard: the ranks of a shard group holding the same experts (D·C/E, or N/E with
    // hybrid sharding), which sum and shard them where the experts' weights are split
    // (config::expert_shards); data_replica then sums their parts as the rest's.
    GroupTraffic expert_shard;
};

// The MoE layers (model.moe) among stage `stage`'s layers.
int64_t moe_layers(const config::Config& cfg, int stage);

std::vector<StageTraffic> plan_traffic(const PlanInputs& in);
// The same with the stages' memory planned already (only their parameters are read).
std::vector<StageTraffic> plan_traffic(const PlanInputs& in,
                                       const std::vector<StageMemory>& memory);

}  // namespace trident::plan
