// The values computed once from a config: padded vocabulary, batch split, parameter count and
// model FLOPs per step (docs/FORMULAS.md, "Parameters" and "FLOPs per step"), the layers of
// each pipeline chunk (config/stage_cuts.h).
#include <algorithm>
#include <cmath>

#include "config/config.h"
#include "config/model_shape.h"
#include "config/stage_cuts.h"

namespace trident::config {
namespace {

int64_t round_up(int64_t value, int64_t multiple) {
    return (value + multiple - 1) / multiple * multiple;
}

// A declared tensor's elements, a vocabulary-split one's padded rows excluded.
int64_t elements(const model::TensorDecl& t, const model::GptShape& shape) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    if (t.split.kind == model::SplitKind::vocabulary) n = n / shape.padded_vocab * shape.vocab;
    return n;
}

// The runs of consecutive layers of the same kinds: what each run's first layer's parts declare
// (ModelSpec::layer_decls) and the run's length. The sums below read sizes, not names, so a
// run's layers count alike and a search deriving thousands of layouts declares each kind once.
struct LayerRun {
    std::vector<model::PartDecl> parts;
    int64_t count = 0;
};
std::vector<LayerRun> layer_runs(const model::ModelSpec& spec) {
    const auto same = [](const model::LayerSpec& a, const model::LayerSpec& b) {
        return a.norm == b.norm && a.attention == b.attention && a.mlp == b.mlp;
    };
    std::vector<LayerRun> runs;
    for (std::size_t l = 0; l < spec.layers.size();) {
        const model::LayerSpec& layer = spec.layers[l];
        std::size_t end = l + 1;
        while (end < spec.layers.size() && same(spec.layers[end], layer)) ++end;
        runs.push_back({spec.layer_decls(static_cast<int>(l)), static_cast<int64_t>(end - l)});
        l = end;
    }
    return runs;
}

// Calls `each(decls, count)` for every run.
template <typename Each>
void for_layer_runs(const std::vector<LayerRun>& runs, Each each) {
    for (const LayerRun& run : runs) each(run.parts, run.count);
}

// Unique parameters of the model, padded rows excluded (docs/FORMULAS.md, "Parameters"): the
// tensors its parts declare. GPT-2's LM head is the token embedding, so it adds nothing.
int64_t count_parameters(const model::ModelSpec& spec, const std::vector<LayerRun>& runs) {
    int64_t n = 0;
    for (const model::TensorDecl& t : spec.embedding_tensors()) n += elements(t, spec.shape);
    for_layer_runs(runs, [&](const std::vector<model::PartDecl>& parts, int64_t count) {
        for (const model::PartDecl& part : parts)
            for (const model::TensorDecl& t : part.tensors) n += count * elements(t, spec.shape);
    });
    for (const model::TensorDecl& t : spec.head_tensors()) n += elements(t, spec.shape);
    return n;
}

// The parameters one token computes with (docs/FORMULAS.md, "Parameters"): all of them but, in
// a mixture of experts, the routed experts it is not sent to, (1 − top_k / experts) of theirs.
int64_t count_active_parameters(const model::ModelSpec& spec, const std::vector<LayerRun>& runs) {
    double idle = 0;
    for_layer_runs(runs, [&](const std::vector<model::PartDecl>& parts, int64_t count) {
        for (const model::PartDecl& part : parts)
            for (const model::GemmDecl& g : part.gemms)
                idle +=
                    count * (1 - g.share) * static_cast<double>(g.in) * static_cast<double>(g.out);
    });
    return count_parameters(spec, runs) - std::llround(idle);
}

// Megatron's model FLOPs for one global batch (training.py, causal attention counted at
// half, no recompute): three times the forward's, which is 2·B·s per weight of the layers'
// linears and of the LM head (V·h) — a routed expert's weights on their share of the tokens,
// top_k / experts — and 2·B·s²·a per layer in attention, a = heads · head_dim (h unless
// model.head_dim differs) — for GPT-2 (F = 4h)
// Megatron's 72·B·s·l·h²·(1 + s/(12h) + V/(12·l·h)). Under low-rank adapters the frozen
// weights get no weight gradient, so their GEMMs run twice the forward's (forward, input
// gradient), attention's still three times, and each adapter (A (r, in), B (out, r)) adds
// three times its forward's 2·B·s·r·(in + out) per layer.
double model_flops(const std::vector<LayerRun>& runs, const ModelConfig& m,
                   const TrainingConfig& t) {
    const double B = t.global_batch, s = m.seq_len, l = m.layers, h = m.hidden, V = m.vocab_size;
    double matrices = 0, widths = 0;  // Σ in·out over the layers' linears; Σ (in + out) adapted
    for_layer_runs(runs, [&](const std::vector<model::PartDecl>& parts, int64_t count) {
        for (const model::PartDecl& part : parts)
            for (const model::LinearDecl& w : part.linears) {
                matrices += count * static_cast<double>(w.in) * static_cast<double>(w.out);
                if (t.lora.enabled() && std::find(t.lora.targets.begin(), t.lora.targets.end(),
                                                  w.target) != t.lora.targets.end())
                    widths += count * static_cast<double>(w.in + w.out);
            }
        for (const model::PartDecl& part : parts)  // a routed expert's on its share of tokens
            for (const model::GemmDecl& g : part.gemms)
                matrices +=
                    count * g.share * static_cast<double>(g.in) * static_cast<double>(g.out);
    });
    const double weights = 2.0 * B * s * (matrices + V * h);
    const double attention =
        2.0 * B * s * s * l * m.heads * (m.head_dim > 0 ? m.head_dim : h / m.heads);
    if (!t.lora.enabled()) return 3.0 * (weights + attention);
    const double adapters = 2.0 * B * s * t.lora.rank * widths;
    return 2.0 * weights + 3.0 * (attention + adapters);
}

}  // namespace

void derive(Config& cfg) {
    const ModelConfig& m = cfg.model;
    const ParallelConfig& p = cfg.parallel;
    const TrainingConfig& t = cfg.training;
    Derived& d = cfg.derived;

    // The vocabulary is split over M, and each shard stays a multiple of 128 for fast GEMMs.
    d.padded_vocab = static_cast<int>(round_up(m.vocab_size, 128 * int64_t{p.tensor}));
    d.head_dim = m.head_dim > 0 ? m.head_dim : m.heads > 0 ? m.hidden / m.heads : 0;
    d.world_size = p.pipeline * p.tensor * p.context * p.data;
    const int per_step = t.micro_batch * p.data;
    d.grad_accum_steps = per_step > 0 ? t.global_batch / per_step : 0;
    d.tokens_per_step = int64_t{t.global_batch} * m.seq_len;
    const model::ModelSpec spec = model::resolve_spec(gpt_shape(cfg));  // reads padded_vocab
    const std::vector<LayerRun> runs = layer_runs(spec);
    d.parameters = count_parameters(spec, runs);
    d.active_parameters = count_active_parameters(spec, runs);
    d.flops_per_step = model_flops(runs, m, t);
    d.chunk_layers = chunk_layers(cfg);  // reads padded_vocab, set above
}

}  // namespace trident::config
