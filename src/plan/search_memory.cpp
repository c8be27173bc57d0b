// The search's memory, piece by piece (see search_memory.h).
#include "plan/search_memory.h"

#include <algorithm>

#include "config/stage_cuts.h"

namespace trident::plan {

namespace {

// The sizes of one rank's microbatch and what its sets keep, as integers.
CacheKey dims_key(const Layout& l) {
    return {l.tensor,
            l.context,
            l.micro_batch,
            l.sequence_parallel,
            l.tp_overlap,
            static_cast<int64_t>(l.recompute),
            pipeline::splits_backward(l.schedule)};
}

// A stage's chunks: their layers, which holds the embedding and which the head, and whether
// the stage is the whole model (ZeRO-3 then keeps the tied embedding gathered).
void add_chunks(std::vector<int64_t>& key, const std::vector<ChunkShape>& chunks, int stages) {
    key.push_back(stages == 1);
    for (const ChunkShape& c : chunks) {
        key.push_back(c.layers);
        key.push_back(c.embeds + 2 * c.head);
    }
}

bool same_chunks(const std::vector<ChunkShape>& a, const std::vector<ChunkShape>& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                      [](const ChunkShape& x, const ChunkShape& y) {
                          return x.layers == y.layers && x.embeds == y.embeds && x.head == y.head;
                      });
}

}  // namespace

SearchMemory::SearchMemory(const config::Config& base, int doc_len)
    : base_(base),
      doc_len_(doc_len),
      grad_bytes_(gradient_bytes(base.training.precision, base.training.fp32_grad_accumulation)),
      cut_(base),
      states_inputs_(plan_inputs(base, grad_bytes_)) {}

const std::vector<int>& SearchMemory::chunk_layers(const Layout& layout) {
    // The cut balances the chunks' GEMM FLOPs (model/flops.h), which depend on these.
    const CacheKey key = {layout.pipeline * layout.virtual_stages, layout.tensor, layout.context,
                          layout.micro_batch, static_cast<int64_t>(layout.recompute)};
    const auto found = cuts_.find(key);
    if (found != cuts_.end()) return found->second;
    const CacheKey shape = {layout.tensor, layout.context, layout.micro_batch,
                            static_cast<int64_t>(layout.recompute)};
    auto costs = cut_costs_.find(shape);
    if (costs == cut_costs_.end()) {
        config::Config cfg = base_;
        cfg.parallel.tensor = layout.tensor;
        cfg.parallel.context = layout.context;
        cfg.training.micro_batch = layout.micro_batch;
        cfg.training.recompute = layout.recompute;
        config::derive(cfg);
        costs = cut_costs_.emplace(shape, config::cut_costs(cfg)).first;
    }
    cut_.parallel.pipeline = layout.pipeline;
    cut_.parallel.virtual_stages = layout.virtual_stages;
    return cuts_.emplace(key, config::chunk_layers(cut_, costs->second)).first->second;
}

int64_t SearchMemory::chunks_id(const std::vector<ChunkShape>& chunks, int stages) {
    chunks_key_.clear();
    add_chunks(chunks_key_, chunks, stages);
    const auto found = chunk_ids_.find(chunks_key_);
    if (found != chunk_ids_.end()) return found->second;
    const auto id = static_cast<int64_t>(chunk_ids_.size());
    return chunk_ids_.emplace(chunks_key_, id).first->second;
}

PlanInputs SearchMemory::inputs(const Layout& layout) {
    config::Config cfg = base_;
    // Derived with its cut given, as derive would find it (once per shape).
    cfg.parallel.stage_layers = {config::StageCut::given, chunk_layers(layout)};
    cfg = apply(cfg, layout);
    cfg.parallel.stage_layers = base_.parallel.stage_layers;
    PlanInputs in = plan_inputs(cfg, grad_bytes_);
    in.doc_len = doc_len_;
    return in;
}

GroupShape SearchMemory::shape(const Layout& layout) {
    GroupShape g;
    shape(layout, g);
    return g;
}

void SearchMemory::shape(const Layout& layout, GroupShape& g) {
    const std::vector<int>& cut = chunk_layers(layout);
    g.stages.resize(static_cast<std::size_t>(layout.pipeline));
    for (int s = 0; s < layout.pipeline; ++s)
        stage_chunks(layout.schedule, layout.pipeline, layout.virtual_stages, cut, s,
                     g.stages[static_cast<std::size_t>(s)]);
    g.microbatches = base_.training.global_batch / (layout.micro_batch * layout.data);
}

std::vector<StageMemory> SearchMemory::parameters(const Layout& layout) {
    const GroupShape g = shape(layout);
    std::vector<StageMemory> stages(g.stages.size());
    for (std::size_t s = 0; s < stages.size(); ++s) {
        stages[s].stage = static_cast<int>(s);
        StageLayouts layouts;
        stages[s].parameters = static_cast<int64_t>(
            states(layout, static_cast<int>(s), g.stages[s], layouts).parameters);
    }
    return stages;
}

const std::vector<InFlight>& SearchMemory::flights(const Layout& l, int microbatches) {
    const CacheKey key = {static_cast<int64_t>(l.schedule), l.pipeline, l.virtual_stages,
                          microbatches};
    const auto found = flights_.find(key);
    if (found != flights_.end()) return found->second;
    return flights_.emplace(key, in_flight(l.schedule, l.pipeline, l.virtual_stages, microbatches))
        .first->second;
}

StageBuffers SearchMemory::probe(const Layout& layout, int P, int v, std::vector<int> chunk_layers,
                                 int stage) {
    const bool split = pipeline::splits_backward(layout.schedule);
    Layout l = layout;
    l.pipeline = P;
    l.virtual_stages = v;
    l.schedule = split ? (v == 2 ? pipeline::Kind::zb_v : pipeline::Kind::zb_h1)
                       : pipeline::Kind::one_f_one_b;
    config::Config cfg = base_;
    cfg.model.layers = 0;
    for (const int n : chunk_layers) cfg.model.layers += n;
    cfg.parallel.stage_layers = {config::StageCut::given, std::move(chunk_layers)};
    cfg = apply(cfg, l);
    // Whether the grid has more than one rank counts (a temporary every rank of one holds).
    cfg.derived.world_size = layout.pipeline * layout.tensor * layout.context * layout.data;
    const PlanInputs in = plan_inputs(cfg, grad_bytes_);
    return stage_buffers(in, stage_layout(in, stage));
}

SearchMemory::BufferCosts& SearchMemory::buffer_costs(const Layout& layout) {
    const CacheKey key = dims_key(layout);
    const auto found = buffers_.find(key);
    if (found != buffers_.end()) return found->second;
    BufferCosts costs;
    // One layer's share: a model of two layers against one of one.
    const StageBuffers one = probe(layout, 1, 1, {1}, 0);
    costs.layer = probe(layout, 1, 1, {2}, 0).set_bytes[0] - one.set_bytes[0];
    costs.own[1][1] = one.set_bytes[0] - *costs.layer;
    costs.temporary[1][1][1] = one.temporary;
    costs.message = one.message;
    return buffers_.emplace(key, costs).first->second;
}

double SearchMemory::set_bytes(const Layout& layout, BufferCosts& costs, const ChunkShape& c) {
    std::optional<double>& own = costs.own[c.embeds][c.head];
    if (!own) {
        // A stage whose one chunk of one layer embeds, ends with the head, or neither.
        const StageBuffers b = c.embeds ? probe(layout, 2, 1, {1, 1}, 0)
                               : c.head ? probe(layout, 2, 1, {1, 1}, 1)
                                        : probe(layout, 3, 1, {1, 1, 1}, 1);
        own = b.set_bytes[0] - *costs.layer;
        costs.temporary[c.embeds][c.head][1] = b.temporary;
    }
    return *own + c.layers * *costs.layer;
}

double SearchMemory::temporary(const Layout& layout, BufferCosts& costs,
                               const std::vector<ChunkShape>& chunks) {
    bool embeds = false, head = false, layers = false;
    for (const ChunkShape& c : chunks) {
        embeds = embeds || c.embeds;
        head = head || c.head;
        layers = layers || c.layers > 0;
    }
    std::optional<double>& t = costs.temporary[embeds][head][layers];
    if (t) return *t;
    const int l = layers ? 1 : 0;
    // A stage of the same kinds of part: both ends without a layer only as ZB-V's stage 0.
    const StageBuffers b = embeds && head ? probe(layout, 2, 2, {l, 1, 1, l}, 0)
                           : embeds       ? probe(layout, 2, 1, {l, 1}, 0)
                           : head         ? probe(layout, 2, 1, {1, l}, 1)
                                          : probe(layout, 3, 1, {1, l, 1}, 1);
    t = b.temporary;
    return *t;
}

SearchMemory::States SearchMemory::states(const Layout& l, int stage,
                                          const std::vector<ChunkShape>& chunks,
                                          StageLayouts& layouts) {
    const int64_t shard = l.data_shard == 0 ? l.data * l.context : l.data_shard;
    const bool adapters = base_.training.lora.enabled();  // padded to D·C, aligned to D
    const CacheKey key = {l.tensor,
                          l.zero_stage,
                          shard,
                          adapters ? l.data : 0,
                          adapters ? l.context : 0,
                          chunks_id(chunks, l.pipeline)};
    const auto found = states_.find(key);
    if (found != states_.end()) return found->second;
    // ZeRO 2 and 3 align each unit to the shard group (memory_model.h, stage_layout).
    const int64_t align = l.zero_stage >= 2 ? shard : 1;
    auto layout = layouts.by_align.find(align);
    if (layout == layouts.by_align.end()) {
        if (!layouts.inputs) layouts.inputs = inputs(l);
        PlanInputs& in = *layouts.inputs;
        in.cfg.parallel.zero_stage = in.zero_stage = l.zero_stage;
        in.cfg.parallel.data_shard = l.data_shard;
        layout = layouts.by_align.emplace(align, stage_layout(in, stage)).first;
    }
    // What stage_states reads of the layout: its sharding, its grid's data and context.
    PlanInputs& in = states_inputs_;
    auto& p = in.cfg.parallel;
    p.tensor = l.tensor;
    p.data = l.data;
    p.context = l.context;
    p.zero_stage = in.zero_stage = l.zero_stage;
    p.data_shard = l.data_shard;
    const StageMemory s = stage_states(in, layout->second);
    const States computed{s.states.total() + s.gathered, static_cast<double>(s.parameters)};
    return states_.emplace(key, computed).first->second;
}

const std::vector<SearchMemory::States>& SearchMemory::states(
    const LayoutGroup& group, int stage, const std::vector<ChunkShape>& chunks) {
    const Layout& l = group.layout;
    const bool adapters = base_.training.lora.enabled();
    const CacheKey key = {l.tensor, l.data * l.context, adapters ? l.data : 0,
                          adapters ? l.context : 0, chunks_id(chunks, l.pipeline)};
    const auto found = sharded_states_.find(key);
    if (found != sharded_states_.end()) return found->second;
    std::vector<States> by_sharding;
    StageLayouts layouts;
    for (const Sharding& sharding : group.shardings) {
        Layout sharded = l;
        sharded.zero_stage = sharding.zero_stage;
        sharded.data_shard = sharding.data_shard;
        by_sharding.push_back(states(sharded, stage, chunks, layouts));
    }
    return sharded_states_.emplace(key, std::move(by_sharding)).first->second;
}

std::vector<double> SearchMemory::Totals::parameters(std::size_t sharding) const {
    std::vector<double> out;
    parameters(sharding, out);
    return out;
}

void SearchMemory::Totals::parameters(std::size_t sharding, std::vector<double>& out) const {
    out.clear();
    for (const std::vector<States>* s : stages) out.push_back((*s)[sharding].parameters);
}

SearchMemory::Totals SearchMemory::totals(const LayoutGroup& group, const GroupShape& g) {
    Totals t;
    totals(group, g, t);
    return t;
}

void SearchMemory::totals(const LayoutGroup& group, const GroupShape& g, Totals& t) {
    const Layout& l = group.layout;
    const std::vector<InFlight>& flight = flights(l, g.microbatches);
    BufferCosts& costs = buffer_costs(l);
    t.most.assign(group.shardings.size(), 0.0);
    t.stages.clear();
    for (std::size_t i = 0; i < g.stages.size(); ++i) {
        double buffered = temporary(l, costs, g.stages[i]) + flight[i].messages * costs.message;
        for (std::size_t c = 0; c < g.stages[i].size(); ++c)
            buffered += flight[i].sets[c] * set_bytes(l, costs, g.stages[i][c]);
        // Middle stages mostly have the chunks of the one before.
        t.stages.push_back(i > 0 && same_chunks(g.stages[i], g.stages[i - 1])
                               ? t.stages.back()
                               : &states(group, static_cast<int>(i), g.stages[i]));
        for (std::size_t k = 0; k < t.most.size(); ++k)
            t.most[k] = std::max(t.most[k], buffered + (*t.stages.back())[k].bytes);
    }
}

}  // namespace trident::plan
