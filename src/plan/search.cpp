// The search (see search.h).
#include "plan/search.h"

#include <algorithm>
#include <unordered_map>

#include "plan/search_memory.h"

namespace trident::plan {

namespace {

// A layout that fits, and a lower bound on its step time.
struct Fitting {
    std::size_t group;     // its group's index among those kept
    std::size_t sharding;  // its index among the group's shardings
    double memory = 0;
    double bound = 0;
    bool tight = false;  // the bound with the group's exchanges of every microbatch
};

// In a heap, the fitting layout with the least bound on top.
bool later(const Fitting& a, const Fitting& b) {
    return a.bound > b.bound;
}

// A group with layouts that fit: those, and their memory.
struct Kept {
    LayoutGroup group;
    std::vector<std::size_t> shardings;
    std::vector<double> memory;
};

// Lower bounds on the step times of layouts (perf_model.h, step_lower_bound). A chunk's compute
// is linear in its layers, with the embedding's and the head's added: its three coefficients
// are computed once per microbatch shape.
class Bounds {
public:
    Bounds(const config::Config& base, SearchMemory& memory, const Hardware& hw)
        : memory_(memory), hw_(hw), scratch_(memory.inputs(Layout{})) {
        scratch_.cfg = base;
    }

    // Each stage's compute of a microbatch, forward and backward.
    std::vector<ChunkSeconds> compute(const Layout& layout, const GroupShape& g) {
        const Coefficients& k = coefficients(layout);
        std::vector<ChunkSeconds> out;
        for (const std::vector<ChunkShape>& stage : g.stages) {
            ChunkSeconds seconds;
            for (const ChunkShape& c : stage) {
                seconds.forward += c.layers * k.layer.forward +
                                   (c.embeds ? k.embedding.forward : 0) +
                                   (c.head ? k.head.forward : 0);
                seconds.backward += c.layers * k.layer.backward +
                                    (c.embeds ? k.embedding.backward : 0) +
                                    (c.head ? k.head.backward : 0);
            }
            out.push_back(seconds);
        }
        return out;
    }

    double bound(const Layout& l, int microbatches, const std::vector<ChunkSeconds>& compute,
                 const std::vector<double>& parameters, const std::vector<double>& exchanges = {}) {
        auto& p = scratch_.cfg.parallel;
        p.pipeline = l.pipeline;
        p.tensor = l.tensor;
        p.context = l.context;
        p.data = l.data;
        p.data_shard = l.data_shard;
        p.schedule = l.schedule;
        p.virtual_stages = l.virtual_stages;
        p.zero_stage = scratch_.zero_stage = l.zero_stage;
        scratch_.cfg.derived.grad_accum_steps = microbatches;
        return step_lower_bound(scratch_, hw_, compute, parameters, exchanges);
    }

    // The tight bounds of a kept group's layouts: with the exchanges of every microbatch that
    // ZeRO's sharding does not change (planned at stage 0).
    std::vector<Fitting> tighten(const Kept& kept, std::size_t index) {
        Layout l = kept.group.layout;
        const GroupShape g = memory_.shape(l);
        const std::vector<ChunkSeconds> seconds = compute(l, g);
        const PlanInputs in = memory_.inputs(l);
        const std::vector<double> exchanges =
            microbatch_exchange_seconds(in, hw_, plan_traffic(in, memory_.parameters(l)));
        std::vector<Fitting> out;
        for (std::size_t i = 0; i < kept.shardings.size(); ++i) {
            const Sharding& sharding = kept.group.shardings[kept.shardings[i]];
            l.zero_stage = sharding.zero_stage;
            l.data_shard = sharding.data_shard;
            std::vector<double> parameters;
            for (const StageMemory& s : memory_.parameters(l))
                parameters.push_back(static_cast<double>(s.parameters));
            out.push_back({index, kept.shardings[i], kept.memory[i],
                           bound(l, g.microbatches, seconds, parameters, exchanges), true});
        }
        return out;
    }

private:
    struct Coefficients {
        ChunkSeconds layer, embedding, head;
    };
    const Coefficients& coefficients(const Layout& l) {
        const CacheKey key = {l.tensor,      l.context,
                              l.micro_batch, l.sequence_parallel,
                              l.tp_overlap,  static_cast<int64_t>(l.recompute)};
        const auto found = cache_.find(key);
        if (found != cache_.end()) return found->second;
        const PlanInputs in = memory_.inputs(l);
        Coefficients k;
        k.layer = chunk_seconds(in, {1, false, false}, hw_);
        k.embedding = chunk_seconds(in, {0, true, false}, hw_);
        k.head = chunk_seconds(in, {0, false, true}, hw_);
        return cache_.emplace(key, k).first->second;
    }

    SearchMemory& memory_;
    const Hardware& hw_;
    PlanInputs scratch_;  // the base's, set to each layout bound
    std::unordered_map<CacheKey, Coefficients, CacheKeyHash> cache_;
};

// Every layout's memory; the groups with layouts that fit, and those layouts with their
// loose bounds.
void fit(const config::Config& base, const SearchOptions& options, SearchMemory& memory,
         Bounds& bounds, SearchResult& result, std::vector<Kept>& kept,
         std::vector<Fitting>& fitting) {
    // Refilled for each group, their storage reused.
    GroupShape shape;
    SearchMemory::Totals totals;
    std::vector<double> parameters;
    const auto visit = [&](const LayoutGroup& group) {
        memory.shape(group.layout, shape);
        memory.totals(group, shape, totals);
        std::vector<ChunkSeconds> compute;
        for (std::size_t i = 0; i < totals.most.size(); ++i) {
            Layout l = group.layout;
            l.zero_stage = group.shardings[i].zero_stage;
            l.data_shard = group.shardings[i].data_shard;
            if (result.considered++ == 0 || totals.most[i] < result.smallest.memory)
                result.smallest = {l, totals.most[i], {}};
            if (totals.most[i] > options.device_memory) continue;
            if (compute.empty()) {
                compute = bounds.compute(group.layout, shape);
                kept.push_back({group, {}, {}});
            }
            totals.parameters(i, parameters);
            fitting.push_back({kept.size() - 1, i, totals.most[i],
                               bounds.bound(l, shape.microbatches, compute, parameters)});
            kept.back().shardings.push_back(i);
            kept.back().memory.push_back(totals.most[i]);
        }
    };
    enumerate(base, options.space, visit, result.rejected);
    result.fit = static_cast<int64_t>(fitting.size());
}

// Whether `a` ranks before `b`: the shorter step; on a tie, the one modelled first.
bool faster(const Ranked& a, const Ranked& b) {
    return a.time.step < b.time.step;
}

}  // namespace

SearchResult search(const config::Config& base, const SearchOptions& options) {
    SearchResult result;
    SearchMemory memory(base, options.doc_len);
    Bounds bounds(base, memory, options.hardware);
    std::vector<Kept> kept;
    std::vector<Fitting> fitting;
    fit(base, options, memory, bounds, result, kept, fitting);
    // Layouts go by their bounds, least first: a loose one for all, tightened for a group's
    // layouts the first time one of them comes up, modelled when a tight one comes up.
    std::make_heap(fitting.begin(), fitting.end(), later);
    std::vector<bool> tightened(kept.size(), false);
    const std::size_t top =
        options.top > 0 ? static_cast<std::size_t>(options.top) : static_cast<std::size_t>(-1);
    std::vector<Ranked>& best = result.best;  // sorted, at most `top`
    BubbleCache bubbles;
    while (!fitting.empty()) {
        std::pop_heap(fitting.begin(), fitting.end(), later);
        const Fitting f = fitting.back();
        fitting.pop_back();
        if (best.size() >= top && f.bound > best.back().time.step) break;
        if (!f.tight) {
            if (tightened[f.group]) continue;  // its tight bound is in the heap
            tightened[f.group] = true;
            for (const Fitting& t : bounds.tighten(kept[f.group], f.group)) {
                fitting.push_back(t);
                std::push_heap(fitting.begin(), fitting.end(), later);
            }
            continue;
        }
        const LayoutGroup& group = kept[f.group].group;
        Ranked r{group.layout, f.memory, {}};
        r.layout.zero_stage = group.shardings[f.sharding].zero_stage;
        r.layout.data_shard = group.shardings[f.sharding].data_shard;
        r.time = predict_step(memory.inputs(r.layout), options.hardware,
                              memory.parameters(r.layout), bubbles);
        ++result.modelled;
        best.insert(std::upper_bound(best.begin(), best.end(), r, faster), r);
        if (best.size() > top) best.pop_back();
    }
    return result;
}

}  // namespace trident::plan
