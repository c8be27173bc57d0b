// Layers per pipeline chunk (see stage_cuts.h).
#include "config/stage_cuts.h"

#include <algorithm>

#include "config/model_shape.h"
#include "model/flops.h"

namespace trident::config {

std::vector<int> balanced_layers(int layers, int chunks, double layer_cost, double first_extra,
                                 double last_extra) {
    std::vector<int> counts(static_cast<std::size_t>(chunks), 0);
    std::vector<double> load(static_cast<std::size_t>(chunks), 0.0);
    load.front() += first_extra;
    load.back() += last_extra;
    // The least loaded chunk on top, of equal ones the later.
    const auto later_first = [&](std::size_t a, std::size_t b) {
        return load[a] > load[b] || (load[a] == load[b] && a < b);
    };
    std::vector<std::size_t> heap(load.size());
    for (std::size_t g = 0; g < heap.size(); ++g) heap[g] = g;
    std::make_heap(heap.begin(), heap.end(), later_first);
    for (int l = 0; l < layers; ++l) {
        std::pop_heap(heap.begin(), heap.end(), later_first);
        const std::size_t best = heap.back();
        load[best] += layer_cost;
        ++counts[best];
        std::push_heap(heap.begin(), heap.end(), later_first);
    }
    return counts;
}

CutCosts cut_costs(const Config& cfg) {
    const model::GemmFlops f = model::gemm_flops(model::resolve_spec(gpt_shape(cfg)),
                                                 rank_dims(cfg), cfg.training.recompute);
    return {f.layer_forward + f.layer_backward, f.head_forward + f.head_backward};
}

std::vector<int> chunk_layers(const Config& cfg) {
    const bool balanced = cfg.parallel.stage_layers.cut == StageCut::auto_;
    return chunk_layers(cfg, balanced ? cut_costs(cfg) : CutCosts{});
}

std::vector<int> chunk_layers(const Config& cfg, const CutCosts& costs) {
    const StageLayers& cut = cfg.parallel.stage_layers;
    const int chunks = cfg.parallel.pipeline * cfg.parallel.virtual_stages;
    switch (cut.cut) {
        case StageCut::given:
            return cut.layers;
        case StageCut::uniform:
            return std::vector<int>(static_cast<std::size_t>(chunks), cfg.model.layers / chunks);
        case StageCut::auto_:
            break;
    }
    return balanced_layers(cfg.model.layers, chunks, costs.layer, 0.0, costs.head);
}

}  // namespace trident::config
