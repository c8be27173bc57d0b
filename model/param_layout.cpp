// Builds the flat-buffer layout of model/param_layout.h and maps slices to whole tensors.
#include "model/param_layout.h"

#include <algorithm>
#include <functional>

#include "kernels/error.h"

namespace trident::model {

namespace {

void require_divisible(const char* what, int value, int tensor_size) {
    if (value % tensor_size != 0)
        throw Error(std::string(what) + " (" + std::to_string(value) +
                    ") must be divisible by parallel.tensor (" + std::to_string(tensor_size) + ")");
}

// The local shape of a tensor of `full` shape under `split`, each slice held by `replicas`
// ranks.
std::vector<int64_t> local_shape(std::vector<int64_t> full, Split split, int tensor_size,
                                 int replicas) {
    switch (split) {
        case Split::replicated:
            break;
        case Split::rows:
            full[0] /= tensor_size / replicas;
            break;
        case Split::qkv_rows:
            full[0] /= tensor_size;
            break;
        case Split::columns:
            full[1] /= tensor_size;
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

ParamLayout::ParamLayout(const GptShape& shape, int tensor_rank, int tensor_size,
                         const StagePlan& plan, int unit_align)
    : ParamLayout(shape, nullptr, tensor_rank, tensor_size, plan, unit_align) {}

ParamLayout ParamLayout::for_lora(const GptShape& shape, const LoraShape& lora, int tensor_rank,
                                  int tensor_size, const StagePlan& plan, int unit_align) {
    return ParamLayout(shape, &lora, tensor_rank, tensor_size, plan, unit_align);
}

ParamLayout::ParamLayout(const GptShape& shape, const LoraShape* lora, int tensor_rank,
                         int tensor_size, const StagePlan& plan, int unit_align)
    : shape_(shape),
      tensor_rank_(tensor_rank),
      tensor_size_(tensor_size),
      plan_(plan),
      lora_(lora ? *lora : LoraShape{}) {
    require_divisible("model.heads", shape.heads, tensor_size);
    if (shape.kv_heads % tensor_size != 0 && tensor_size % shape.kv_heads != 0)
        throw Error("parallel.tensor (" + std::to_string(tensor_size) +
                    ") must divide model.kv_heads (" + std::to_string(shape.kv_heads) +
                    ") or be a multiple of it");
    require_divisible("model.ffn_hidden", shape.ffn, tensor_size);
    require_divisible("the padded vocabulary", shape.padded_vocab, tensor_size);
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
    // A unit starts at the next multiple of the alignment (and the last one ends at one).
    const std::size_t align = static_cast<std::size_t>(std::max(unit_align, 1));
    std::vector<std::size_t> begins;
    const auto start_unit = [&] {
        total_ = (total_ + align - 1) / align * align;
        begins.push_back(total_);
    };
    const int64_t H = shape.hidden, Vp = shape.padded_vocab;
    const bool llama = shape.arch == Arch::llama;
    const bool holds_wte = plan.first() || (plan.last() && shape.tied);
    if (!lora && holds_wte) {
        start_unit();
        wte_ = add(wte_name(), {Vp, H}, true, Split::rows);
        if (shape.tied) head_ = wte_;
    }
    if (!lora && plan.first() && !llama) {
        if (plan.stages > 1) start_unit();  // else one unit with wte: the embedding
        wpe_ = add("wpe.weight", {shape.max_seq, H}, true, Split::replicated);
    }
    if (!lora && plan.first()) embedding_range_ = {wte_, total_};
    for (int c = 0; c < plan.chunks; ++c)
        for (int l = first_layer(c); l < first_layer(c) + chunk_layers(c); ++l) {
            start_unit();
            const std::size_t begin = total_;
            if (lora)
                add_lora((llama ? "layers." : "h.") + std::to_string(l) + ".", *lora);
            else
                layers_.push_back(llama ? add_llama_layer("layers." + std::to_string(l) + ".")
                                        : add_gpt2_layer("h." + std::to_string(l) + "."));
            layer_ids_.push_back(l);
            layer_ranges_.emplace_back(begin, total_);
        }
    if (!lora && plan.last()) {
        start_unit();
        lnf_w_ = add(llama ? "norm.weight" : "ln_f.weight", {H}, false, Split::replicated);
        if (!llama) lnf_b_ = add("ln_f.bias", {H}, false, Split::replicated);
        if (!shape.tied) head_ = add("lm_head.weight", {Vp, H}, true, Split::rows);
        head_range_ = {lnf_w_, total_};
    }
    total_ = (total_ + align - 1) / align * align;
    for (std::size_t u = 0; u < begins.size(); ++u)
        units_.emplace_back(begins[u], u + 1 < begins.size() ? begins[u + 1] : total_);
}

LayerParams ParamLayout::add_gpt2_layer(const std::string& p) {
    const int64_t H = shape_.hidden, F = shape_.ffn;
    LayerParams lp{};
    lp.ln1_w = add(p + "ln_1.weight", {H}, false, Split::replicated);
    lp.ln1_b = add(p + "ln_1.bias", {H}, false, Split::replicated);
    lp.qkv_w = add(p + "attn.c_attn.weight", {3 * H, H}, true, Split::qkv_rows);
    lp.qkv_b = add(p + "attn.c_attn.bias", {3 * H}, false, Split::qkv_rows);
    lp.attn_proj_w = add(p + "attn.c_proj.weight", {H, H}, true, Split::columns);
    lp.attn_proj_b = add(p + "attn.c_proj.bias", {H}, false, Split::replicated);
    lp.ln2_w = add(p + "ln_2.weight", {H}, false, Split::replicated);
    lp.ln2_b = add(p + "ln_2.bias", {H}, false, Split::replicated);
    lp.fc_w = add(p + "mlp.c_fc.weight", {F, H}, true, Split::rows);
    lp.fc_b = add(p + "mlp.c_fc.bias", {F}, false, Split::rows);
    lp.fc_proj_w = add(p + "mlp.c_proj.weight", {H, F}, true, Split::columns);
    lp.fc_proj_b = add(p + "mlp.c_proj.bias", {H}, false, Split::replicated);
    return lp;
}

LayerParams ParamLayout::add_llama_layer(const std::string& p) {
    const int64_t H = shape_.hidden, F = shape_.ffn;
    const int64_t KV = H / shape_.heads * shape_.kv_heads;  // the key/value heads' width
    LayerParams lp{};
    lp.ln1_b = lp.qkv_b = lp.attn_proj_b = lp.ln2_b = lp.fc_b = lp.fc_proj_b = kNoParam;
    lp.ln1_w = add(p + "input_layernorm.weight", {H}, false, Split::replicated);
    lp.qkv_w = add(p + "self_attn.q_proj.weight", {H, H}, true, Split::rows);
    const int replicas = kv_replicas(shape_.kv_heads, tensor_size_);
    add(p + "self_attn.k_proj.weight", {KV, H}, true, Split::rows, replicas);
    add(p + "self_attn.v_proj.weight", {KV, H}, true, Split::rows, replicas);
    lp.attn_proj_w = add(p + "self_attn.o_proj.weight", {H, H}, true, Split::columns);
    lp.ln2_w = add(p + "post_attention_layernorm.weight", {H}, false, Split::replicated);
    lp.fc_w = add(p + "mlp.gate_proj.weight", {F, H}, true, Split::rows);
    add(p + "mlp.up_proj.weight", {F, H}, true, Split::rows);
    lp.fc_proj_w = add(p + "mlp.down_proj.weight", {H, F}, true, Split::columns);
    return lp;
}

const char* ParamLayout::wte_name() const {
    return shape_.arch == Arch::llama ? "embed_tokens.weight" : "wte.weight";
}

int ParamLayout::chunk_layers(int c) const {
    const int g = plan_.global_chunk(c);
    if (plan_.chunk_layers.empty()) return shape_.layers / (plan_.stages * plan_.chunks);
    return plan_.chunk_layers[static_cast<std::size_t>(g)];
}

int ParamLayout::first_layer(int c) const {
    const int g = plan_.global_chunk(c);
    if (plan_.chunk_layers.empty()) return g * (shape_.layers / (plan_.stages * plan_.chunks));
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

const LayerParams& ParamLayout::layer(int l) const {
    return layers_.at(layer_index(l));
}

const LayerLora& ParamLayout::layer_lora(int l) const {
    return lora_layers_.at(layer_index(l));
}

void ParamLayout::add_lora(const std::string& prefix, const LoraShape& lora) {
    const int64_t H = shape_.hidden, F = shape_.ffn, r = lora.rank;
    const int64_t KV = H / shape_.heads * shape_.kv_heads;  // llama's key/value width
    // Per target: the linear's name, its (out, in), and the splits of A and B.
    struct Linear {
        const char* name;
        int64_t out, in;
        Split a, b;
    };
    constexpr Split whole = Split::replicated, rows = Split::rows, columns = Split::columns;
    const Linear linears[kLoraTargets] = {
        {"attn.c_attn", 3 * H, H, whole, Split::qkv_rows},
        {"attn.c_proj", H, H, columns, whole},
        {"mlp.c_fc", F, H, whole, rows},
        {"mlp.c_proj", H, F, columns, whole},
        {"self_attn.q_proj", H, H, whole, rows},
        {"self_attn.k_proj", KV, H, whole, rows},
        {"self_attn.v_proj", KV, H, whole, rows},
        {"self_attn.o_proj", H, H, columns, whole},
        {"mlp.gate_proj", F, H, whole, rows},
        {"mlp.up_proj", F, H, whole, rows},
        {"mlp.down_proj", H, F, columns, whole},
    };
    const bool llama = shape_.arch == Arch::llama;
    LayerLora la{};
    for (std::size_t t = 0; t < kLoraTargets; ++t) {
        la.a[t] = la.b[t] = kNoLora;
        if (!lora.targets[t]) continue;
        if (is_llama_target(static_cast<LoraTarget>(t)) != llama)
            throw Error(std::string("an adapter of ") + linears[t].name + " for a " +
                        (llama ? "llama" : "GPT-2") + " layer, which has no such linear");
        const Linear& w = linears[t];
        const std::string name = prefix + w.name;
        la.a[t] = add(name + ".lora_A.weight", {r, w.in}, true, w.a);
        la.b[t] = add(name + ".lora_B.weight", {w.out, r}, true, w.b);
    }
    lora_layers_.push_back(la);
}

std::size_t ParamLayout::add(const std::string& name, std::vector<int64_t> full_shape, bool decay,
                             Split split, int replicas) {
    std::vector<int64_t> shape = local_shape(full_shape, split, tensor_size_, replicas);
    std::size_t numel = 1;
    for (int64_t d : shape) numel *= static_cast<std::size_t>(d);
    tensors_.push_back(ParamTensor{name, std::move(shape), std::move(full_shape), total_, numel,
                                   decay, split, replicas});
    total_ += numel;
    return tensors_.back().offset;
}

const ParamTensor* ParamLayout::find(const std::string& name) const {
    for (const auto& t : tensors_)
        if (t.name == name) return &t;
    return nullptr;
}

int kv_replicas(int kv_heads, int tensor_size) {
    return kv_heads > 0 && tensor_size > kv_heads ? tensor_size / kv_heads : 1;
}

bool ParamLayout::held_elsewhere(const ParamTensor& t) const {
    return (t.split == Split::replicated && tensor_rank_ != 0) || tensor_rank_ % t.replicas != 0 ||
           (shape_.tied && t.name == wte_name() && !plan_.first());
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
    switch (t.split) {
        case Split::replicated:
            fn(0, 0, t.numel);
            break;
        case Split::rows:
            fn(0, rank / static_cast<std::size_t>(t.replicas) * t.numel, t.numel);
            break;
        case Split::qkv_rows: {  // three blocks: q, k, v
            std::size_t full_numel = 1;
            for (int64_t d : t.full_shape) full_numel *= static_cast<std::size_t>(d);
            const std::size_t block = t.numel / 3;
            for (std::size_t j = 0; j < 3; ++j)
                fn(j * block, j * (full_numel / 3) + rank * block, block);
            break;
        }
        case Split::columns: {
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
    // head's rows on the first of its replicas, and wte (held by the first and the last
    // stage) on the first.
    std::vector<float> mine(local);
    for (const ParamTensor& t : local_layout.tensors()) {
        if (local_layout.held_elsewhere(t))
            std::fill_n(mine.begin() + static_cast<std::ptrdiff_t>(t.offset), t.numel, 0.0f);
    }
    std::vector<float> whole(whole_layout.total(), 0.0f);
    unshard_params(local_layout, mine.data(), whole_layout, whole.data());
    return whole;
}

}  // namespace trident::model
