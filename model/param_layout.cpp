// Builds the flat-buffer layout of model/param_layout.h and maps slices to whole tensors.
#include "model/param_layout.h"

#include <algorithm>
#include <functional>

#include "kernels/error.h"

namespace trident::model {

namespace {

void require_divisible(const char* what, int value, int M) {
    if (value % M != 0)
        throw Error(std::string(what) + " (" + std::to_string(value) +
                    ") must be divisible by parallel.tensor (" + std::to_string(M) + ")");
}

// The local shape of a tensor of `full` shape under `split`, each slice held by `replicas`
// ranks.
std::vector<int64_t> local_shape(std::vector<int64_t> full, const Split& split, int M,
                                 int replicas) {
    switch (split.kind) {
        case SplitKind::replicated:
            break;
        case SplitKind::column:
        case SplitKind::vocabulary:
            full[0] /= M / replicas;
            break;
        case SplitKind::row:
            full[1] /= M;
            break;
    }
    return full;
}

// Calls copy(local_offset, full_offset, count) for every contiguous run of the rank's slice,
// offsets into the two layouts' buffers.
template <typename Copy>
void for_each_run(const ParamTensor& local, const ParamTensor& full, int rank, Copy copy) {
    for_each_slice_run(local, rank, [&](std::size_t l, std::size_t f, std::size_t n) {
        copy(local.offset + l, full.offset + f, n);
    });
}

}  // namespace

ParamLayout::ParamLayout(const GptShape& shape, int tensor_rank, int M, const StagePlan& plan,
                         int unit_align)
    : ParamLayout(shape, nullptr, tensor_rank, M, plan, unit_align) {}

ParamLayout ParamLayout::for_lora(const GptShape& shape, const LoraShape& lora, int tensor_rank,
                                  int M, const StagePlan& plan, int unit_align) {
    return ParamLayout(shape, &lora, tensor_rank, M, plan, unit_align);
}

ParamLayout::ParamLayout(const GptShape& shape, const LoraShape* lora, int tensor_rank, int M,
                         const StagePlan& plan, int unit_align)
    : spec_(resolve_spec(shape)),
      tensor_rank_(tensor_rank),
      M_(M),
      plan_(plan),
      align_(static_cast<std::size_t>(std::max(unit_align, 1))),
      lora_(lora ? *lora : LoraShape{}) {
    require_divisible("model.heads", shape.heads, M);
    if (shape.kv_heads % M != 0 && M % shape.kv_heads != 0)
        throw Error("parallel.tensor (" + std::to_string(M) + ") must divide model.kv_heads (" +
                    std::to_string(shape.kv_heads) + ") or be a multiple of it");
    require_divisible("model.ffn_hidden", shape.ffn, M);
    require_divisible("the padded vocabulary", shape.padded_vocab, M);
    if (plan.experts > 1 && shape.moe.experts % plan.experts != 0)
        throw Error("model.moe.experts (" + std::to_string(shape.moe.experts) +
                    ") must be divisible by parallel.expert (" + std::to_string(plan.experts) +
                    ")");
    const int chunks = plan.stages * plan.chunks;
    if (plan.chunk_layers.empty() && shape.layers % chunks != 0)
        throw Error("model.layers (" + std::to_string(shape.layers) +
                    ") must be a multiple of parallel.pipeline × virtual_stages = " +
                    std::to_string(plan.stages) + " × " + std::to_string(plan.chunks));
    if (!plan.chunk_layers.empty()) {
        int total = 0;
        for (int n : plan.chunk_layers) total += n;
        if (static_cast<int>(plan.chunk_layers.size()) != chunks || total != shape.layers)
            throw Error("internal: " + std::to_string(plan.chunk_layers.size()) +
                        " chunk layer counts adding up to " + std::to_string(total) + " for " +
                        std::to_string(chunks) + " chunks of " + std::to_string(shape.layers) +
                        " layers");
    }
    int held = 0;  // layers, each one unit
    for (int c = 0; c < plan.chunks; ++c) held += chunk_layers(c);
    units_.reserve(static_cast<std::size_t>(held) + 3);
    layer_ids_.reserve(static_cast<std::size_t>(held));
    layer_ranges_.reserve(static_cast<std::size_t>(held));
    if (!lora) add_embedding(plan.first() || (plan.last() && shape.tied));
    // A part's declarations depend on its kind alone: a run of alike layers is declared once.
    std::vector<PartDecl> decls;
    int declared = -1;  // the layer `decls` are of
    for (int c = 0; c < plan.chunks; ++c)
        for (int l = first_layer(c); l < first_layer(c) + chunk_layers(c); ++l) {
            start_unit(spec_.layer_prefix + std::to_string(l));
            const std::size_t begin = total_;
            if (!lora && (declared < 0 || !(spec_.layers[static_cast<std::size_t>(l)] ==
                                            spec_.layers[static_cast<std::size_t>(declared)]))) {
                decls = spec_.layer_decls(l);
                if (declared < 0) {  // as many for every layer, as a rule, and the head's few
                    std::size_t tensors = 0;
                    for (const PartDecl& part : decls) tensors += part.tensors.size();
                    tensors_.reserve(tensors_.size() + static_cast<std::size_t>(held) * tensors +
                                     4);
                }
                declared = l;
            }
            if (lora)
                add_lora(l, *lora);
            else
                add_layer(l, decls);
            layer_ids_.push_back(l);
            layer_ranges_.emplace_back(begin, total_);
        }
    if (!lora && plan.last()) add_head();
    total_ = (total_ + align_ - 1) / align_ * align_;
    for (std::size_t u = 0; u < units_.size(); ++u)
        units_[u].end = u + 1 < units_.size() ? units_[u + 1].begin : total_;
}

std::vector<std::pair<std::size_t, std::size_t>> ParamLayout::unit_ranges() const {
    std::vector<std::pair<std::size_t, std::size_t>> ranges;
    for (const Unit& u : units_) ranges.emplace_back(u.begin, u.end);
    return ranges;
}

void ParamLayout::start_unit(const std::string& name) {
    total_ = (total_ + align_ - 1) / align_ * align_;
    units_.push_back(Unit{name, total_, total_});
}

// The token embedding on the first stage (and, tied, on the last), wpe on the first: one unit
// on a single stage; on a pipeline each its own, so that the first and the last stage hold the
// same unit of a tied wte.
void ParamLayout::add_embedding(bool holds_wte) {
    const std::vector<TensorDecl> tensors = spec_.embedding_tensors();
    const bool alone = plan_.stages > 1;
    if (holds_wte) {
        start_unit(alone ? spec_.token_embedding : "embedding");
        wte_ = add(tensors[0]);
        if (shape().tied) head_ = wte_;
    }
    if (plan_.first() && spec_.position_embedding) {
        if (alone) start_unit(tensors[1].name.substr(0, tensors[1].name.find('.')));
        wpe_ = add(tensors[1]);
    }
    if (plan_.first()) embedding_range_ = {wte_, total_};
}

void ParamLayout::add_layer(int l, const std::vector<PartDecl>& decls) {
    LayerTensors layer;
    for (std::size_t p = 0; p < decls.size(); ++p) {
        const std::string prefix = spec_.part_prefix(l, static_cast<LayerPart>(p));
        const std::vector<TensorDecl>& tensors = decls[p].tensors;
        layer.parts[p].reserve(tensors.size());
        bool in_run = false;  // within the run of the experts held (declared consecutively)
        for (const TensorDecl& t : tensors) {
            const bool split = t.split.expert >= 0 && plan_.experts > 1;
            if (split && !holds_expert(t.split.expert)) {
                layer.parts[p].push_back(kNoParam);
                continue;
            }
            if (split != in_run) align_run(split);
            in_run = split;
            layer.parts[p].push_back(add(t, prefix + t.name));
        }
        if (in_run) align_run(false);
    }
    layers_.push_back(std::move(layer));
}

// The run of the experts held starts (`starts`) or ends at the unit alignment.
void ParamLayout::align_run(bool starts) {
    total_ = (total_ + align_ - 1) / align_ * align_;
    if (starts)
        expert_runs_.emplace_back(total_, total_);
    else
        expert_runs_.back().second = total_;
}

bool ParamLayout::holds_expert(int e) const {
    const int L = shape().moe.experts / plan_.experts;
    return e / L == plan_.expert_rank;
}

void ParamLayout::add_head() {
    start_unit("head");
    const std::size_t begin = total_;
    std::vector<TensorDecl> tensors = spec_.head_tensors();
    const std::size_t norm_tensors = tensors.size() - (shape().tied ? 0 : 1);
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        const std::size_t at = add(tensors[i]);
        if (i < norm_tensors)
            final_norm_.push_back(at);
        else
            head_ = at;
    }
    head_range_ = {begin, total_};
}

int ParamLayout::chunk_layers(int c) const {
    const int g = plan_.global_chunk(c);
    if (plan_.chunk_layers.empty()) return shape().layers / (plan_.stages * plan_.chunks);
    return plan_.chunk_layers[static_cast<std::size_t>(g)];
}

int ParamLayout::first_layer(int c) const {
    const int g = plan_.global_chunk(c);
    if (plan_.chunk_layers.empty()) return g * (shape().layers / (plan_.stages * plan_.chunks));
    int first = 0;
    for (int k = 0; k < g; ++k) first += plan_.chunk_layers[static_cast<std::size_t>(k)];
    return first;
}

std::size_t ParamLayout::layer_index(int l) const {
    const auto it = std::lower_bound(layer_ids_.begin(), layer_ids_.end(), l);
    if (it == layer_ids_.end() || *it != l)
        throw Error("internal: layer " + std::to_string(l) + " is not on this pipeline stage");
    return static_cast<std::size_t>(it - layer_ids_.begin());
}

std::pair<std::size_t, std::size_t> ParamLayout::layer_range(int l) const {
    return layer_ranges_[layer_index(l)];
}

const LayerTensors& ParamLayout::layer(int l) const {
    return layers_.at(layer_index(l));
}

const LayerLora& ParamLayout::layer_lora(int l) const {
    return lora_layers_.at(layer_index(l));
}

void ParamLayout::add_lora(int l, const LoraShape& lora) {
    LayerLora la{};
    la.a.fill(kNoLora);
    la.b.fill(kNoLora);
    // No adapters (the model's parts built without them): no linear to look at.
    if (std::none_of(lora.targets.begin(), lora.targets.end(), [](bool t) { return t; })) {
        lora_layers_.push_back(la);
        return;
    }
    const std::vector<LinearDecl> linears = spec_.layer_linears(l);
    // In the order the parts compute their linears (GPT-2's qkv, attn_proj, fc, fc_proj; Llama's
    // q, k, v, o, gate, up, down).
    for (const LinearDecl& w : linears) {
        const std::size_t t = static_cast<std::size_t>(w.target);
        if (!lora.targets[t]) continue;
        // Beside a column-parallel W, A is whole and B split like W's rows; beside a
        // row-parallel W, A is split by columns like W and B whole.
        const bool column = w.split.kind == SplitKind::column;
        const Split whole{};
        la.a[t] = add({w.name + ".lora_A.weight",
                       {lora.rank, w.in},
                       column ? whole : w.split,
                       Init::fan_in_uniform,
                       true});
        la.b[t] = add({w.name + ".lora_B.weight",
                       {w.out, lora.rank},
                       column ? w.split : whole,
                       Init::zeros,
                       true});
    }
    for (int t = 0; t < kLoraTargets; ++t)
        if (lora.targets[static_cast<std::size_t>(t)] &&
            la.a[static_cast<std::size_t>(t)] == kNoLora)
            throw Error("an adapter of " +
                        std::string(lora_target_name(static_cast<LoraTarget>(t))) +
                        " for a layer which has no such linear");
    lora_layers_.push_back(la);
}

std::size_t ParamLayout::add(const TensorDecl& t) {
    return add(t, t.name);
}

std::size_t ParamLayout::add(const TensorDecl& t, std::string name) {
    const int replicas = t.split.kind == SplitKind::column && t.split.groups > 0
                             ? kv_replicas(t.split.groups, M_)
                             : 1;
    std::vector<int64_t> shape = local_shape(t.shape, t.split, M_, replicas);
    std::size_t numel = 1;
    for (int64_t d : shape) numel *= static_cast<std::size_t>(d);
    tensors_.push_back(ParamTensor{std::move(name), std::move(shape), t.shape, total_, numel,
                                   t.split, t.init, t.decay, t.trains, replicas});
    total_ += numel;
    return tensors_.back().offset;
}

const ParamTensor* ParamLayout::find(const std::string& name) const {
    for (const auto& t : tensors_)
        if (t.name == name) return &t;
    return nullptr;
}

int kv_replicas(int kv_heads, int M) {
    return kv_heads > 0 && M > kv_heads ? M / kv_heads : 1;
}

bool ParamLayout::held_elsewhere(const ParamTensor& t) const {
    return (t.split.kind == SplitKind::replicated && tensor_rank_ != 0) ||
           tensor_rank_ % t.replicas != 0 ||
           (shape().tied && t.name == wte_name() && !plan_.first());
}

void shard_params(const ParamLayout& full_layout, const float* full,
                  const ParamLayout& local_layout, float* local) {
    for (const ParamTensor& t : local_layout.tensors())
        for_each_run(t, *full_layout.find(t.name), local_layout.tensor_rank(),
                     [&](std::size_t lo, std::size_t fo, std::size_t n) {
                         std::copy_n(full + fo, n, local + lo);
                     });
}

void for_each_slice_run(const ParamTensor& t, int tensor_rank,
                        const std::function<void(std::size_t, std::size_t, std::size_t)>& fn) {
    const std::size_t rank = static_cast<std::size_t>(tensor_rank);
    switch (t.split.kind) {
        case SplitKind::replicated:
            fn(0, 0, t.numel);
            break;
        case SplitKind::column:
        case SplitKind::vocabulary: {  // of each block of rows, this rank's
            std::size_t full_numel = 1;
            for (int64_t d : t.full_shape) full_numel *= static_cast<std::size_t>(d);
            const std::size_t blocks = static_cast<std::size_t>(t.split.blocks);
            const std::size_t block = t.numel / blocks;
            const std::size_t slice = rank / static_cast<std::size_t>(t.replicas);
            for (std::size_t j = 0; j < blocks; ++j)
                fn(j * block, j * (full_numel / blocks) + slice * block, block);
            break;
        }
        case SplitKind::row: {
            const std::size_t rows = static_cast<std::size_t>(t.full_shape[0]);
            const std::size_t cols = static_cast<std::size_t>(t.full_shape[1]);
            const std::size_t width = static_cast<std::size_t>(t.shape[1]);
            for (std::size_t r = 0; r < rows; ++r) fn(r * width, r * cols + rank * width, width);
            break;
        }
    }
}

void unshard_params(const ParamLayout& local_layout, const float* local,
                    const ParamLayout& full_layout, float* full) {
    for (const ParamTensor& t : local_layout.tensors())
        for_each_run(t, *full_layout.find(t.name), local_layout.tensor_rank(),
                     [&](std::size_t lo, std::size_t fo, std::size_t n) {
                         std::copy_n(local + lo, n, full + fo);
                     });
}

std::vector<float> share_of_whole(const ParamLayout& local_layout, const std::vector<float>& local,
                                  const ParamLayout& whole_layout) {
    // Keep only what this rank writes: replicated tensors on tensor rank 0, a key/value
    // head's rows on the first of its replicas, wte (held by the first and the last stage)
    // on the first, and with the experts split the rest of the model on expert rank 0.
    std::vector<float> mine(local);
    for (const ParamTensor& t : local_layout.tensors()) {
        if (local_layout.held_elsewhere(t) || local_layout.expert_copy_elsewhere(t))
            std::fill_n(mine.begin() + static_cast<std::ptrdiff_t>(t.offset), t.numel, 0.0f);
    }
    std::vector<float> whole(whole_layout.total(), 0.0f);
    unshard_params(local_layout, mine.data(), whole_layout, whole.data());
    return whole;
}

}  // namespace trident::model
