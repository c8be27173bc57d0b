// The memory of every layout the search considers, as plan_memory (memory_model.h) counts it,
// to the byte: a stage's total is its model states plus the activation sets its schedule keeps
// in flight times their bytes, plus its temporaries and messages. Each piece is computed once,
// by memory_model.cpp's own functions, and shared by every layout that has it:
// - the sets and messages in flight, by schedule, P, v and microbatches;
// - the buffers of one rank's microbatch shape (M, C, micro batch, sequence parallelism and
//   its overlap, recompute, a split backward): a chunk's set holds its own buffers (its input,
//   the embedding's on the first global chunk, the head's on the last) and one layer's set
//   per layer, all layers alike; a stage's temporaries are the largest of what its parts ask
//   for, so they depend on which kinds of part it holds (the embedding, the head, a layer).
//   Each figure is taken from a stage of one or two layers built as the plan builds it;
// - a stage's model states, by M, its chunks, the ZeRO stage and the shard group (and D and C
//   under low-rank adapters, which pad to them);
// - the cut of the layers into chunks (config::chunk_layers), by P·v and the microbatch's
//   shape, whose FLOPs it balances.
// Layouts that differ only in ZeRO's sharding share everything but the model states, so a
// group of them (search_space.h) is evaluated at once. tests/test_plan_search.cpp holds every
// total to plan_memory's.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <unordered_map>
#include <vector>

#include "config/stage_cuts.h"
#include "plan/memory_model.h"
#include "plan/search_space.h"
#include "plan/stage_shape.h"

namespace trident::plan {

// What the search's caches are keyed by: a few integers (those unset 0), looked up without
// allocating.
using CacheKey = std::array<int64_t, 8>;
struct CacheKeyHash {
    template <typename Key>
    std::size_t operator()(const Key& key) const {
        std::size_t h = key.size();
        for (const int64_t x : key) h = h * 1000003u ^ static_cast<std::size_t>(x);
        return h;
    }
};

// The pipeline shape of a group of layouts: each stage's chunks and its microbatches.
struct GroupShape {
    std::vector<std::vector<ChunkShape>> stages;
    int microbatches = 0;
};

class SearchMemory {
public:
    // `doc_len`: the documents' mean length each layout's inputs take (PlanInputs::doc_len).
    explicit SearchMemory(const config::Config& base, int doc_len = 0);

    // The chunks of every stage of the group's layouts; or into `shape`, its storage reused.
    GroupShape shape(const Layout& layout);
    void shape(const Layout& layout, GroupShape& shape);
    // A stage's model states under one sharding: their bytes and its parameters.
    struct States {
        double bytes = 0, parameters = 0;
    };
    // For each of the group's shardings, in their order, the largest total of any stage; and
    // each stage's model states by sharding (`shape`: the group's).
    struct Totals {
        std::vector<double> most;
        std::vector<const std::vector<States>*> stages;
        std::vector<double> parameters(std::size_t sharding) const;  // of each stage
        void parameters(std::size_t sharding, std::vector<double>& out) const;
    };
    Totals totals(const LayoutGroup& group, const GroupShape& shape);
    void totals(const LayoutGroup& group, const GroupShape& shape, Totals& totals);
    // The plan's inputs for one layout (its config derived once per shape).
    PlanInputs inputs(const Layout& layout);
    // Its stages' memory, as far as the step time reads it: their parameters.
    std::vector<StageMemory> parameters(const Layout& layout);

private:
    const std::vector<int>& chunk_layers(const Layout& layout);
    // A stage's chunks (and whether it is the only stage) as a number: the same for the same.
    int64_t chunks_id(const std::vector<ChunkShape>& chunks, int stages);
    const std::vector<InFlight>& flights(const Layout& layout, int microbatches);
    // The buffers of one microbatch shape, each figure computed when first asked for.
    struct BufferCosts {
        std::optional<double> own[2][2];           // by (embeds, head)
        std::optional<double> layer;               // one layer's share of a set
        std::optional<double> temporary[2][2][2];  // by (embeds, head, a layer)
        double message = 0;
    };
    BufferCosts& buffer_costs(const Layout& layout);
    // A chunk's set, and a stage's temporaries (its messages left out).
    double set_bytes(const Layout& layout, BufferCosts& costs, const ChunkShape& chunk);
    double temporary(const Layout& layout, BufferCosts& costs,
                     const std::vector<ChunkShape>& chunks);
    // The buffers of stage `stage` of a pipeline of `chunk_layers` (P stages, v chunks each,
    // the layers as many as they hold) in the microbatch shape of `layout`.
    StageBuffers probe(const Layout& layout, int P, int v, std::vector<int> chunk_layers,
                       int stage);
    // The model states of a stage of `group` whose chunks are `chunks`, under each of its
    // shardings (all a grid's are those of its D·C): by stage kinds, each by sharding.
    const std::vector<States>& states(const LayoutGroup& group, int stage,
                                      const std::vector<ChunkShape>& chunks);
    // A stage's parameter layouts by the units' alignment, built when first needed from the
    // inputs of the stage's layouts (derived once: a sharding changes none of what they
    // derive).
    struct StageLayouts {
        std::optional<PlanInputs> inputs;
        std::map<int64_t, model::ParamLayout> by_align;
    };
    // Under the layout's own sharding.
    States states(const Layout& layout, int stage, const std::vector<ChunkShape>& chunks,
                  StageLayouts& layouts);

    config::Config base_;
    int doc_len_;
    int grad_bytes_;
    std::unordered_map<CacheKey, config::CutCosts, CacheKeyHash> cut_costs_;
    config::Config cut_;  // the base's, its P and v set for each cut
    std::unordered_map<CacheKey, std::vector<int>, CacheKeyHash> cuts_;
    std::unordered_map<CacheKey, std::vector<InFlight>, CacheKeyHash> flights_;
    std::unordered_map<CacheKey, BufferCosts, CacheKeyHash> buffers_;
    std::vector<int64_t> chunks_key_;  // chunks_id's, refilled for each
    std::unordered_map<std::vector<int64_t>, int64_t, CacheKeyHash> chunk_ids_;
    std::unordered_map<CacheKey, States, CacheKeyHash> states_;
    std::unordered_map<CacheKey, std::vector<States>, CacheKeyHash> sharded_states_;
    PlanInputs states_inputs_;  // the base's, its sharding set for each stage_states
};

}  // namespace trident::plan
