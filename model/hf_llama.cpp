// Hugging Face Llama import and export of model/hf_llama.h.
#include "model/hf_llama.h"

#include <algorithm>
#include <map>
#include <span>

#include "kernels/error.h"
#include "model/hf_moe_config.h"
#include "model/hf_names.h"
#include "model/hf_weights.h"

namespace trident::model {

namespace {

// HF's shape of our tensor: the vocabulary's rows unpadded.
std::vector<int64_t> hf_shape(const ParamTensor& t, const ParamLayout& layout) {
    std::vector<int64_t> shape = t.full_shape;
    if (t.offset == layout.wte() || t.offset == layout.head()) shape[0] = layout.shape().vocab;
    return shape;
}

std::string shape_mismatch(const std::string& path, const io::TensorInfo& info,
                           const std::vector<int64_t>& expected) {
    return path + ": " + info.name + " has shape " + io::shape_string(info.shape) + ", expected " +
           io::shape_string(expected) +
           " (check model.vocab_size, hidden, heads, kv_heads, ffn_hidden against the checkpoint)";
}

}  // namespace

std::string hf_llama_name(const ParamTensor& t, bool mixtral) {
    if (t.name == "lm_head.weight") return t.name;
    return hf_prefix(Arch::llama) + (mixtral ? mixtral_name(t.name) : t.name);
}

void load_hf_llama(const std::string& path, const ParamLayout& layout, float* params) {
    check_hf_family(layout.shape(), "import");
    const HfWeights weights = HfWeights::open(path);
    // Mixtral's files name the experts their own way (model/hf_moe_config.h).
    const bool mixtral = std::any_of(
        weights.tensors().begin(), weights.tensors().end(),
        [](const auto& w) { return w.first.find(".block_sparse_moe.") != std::string::npos; });
    std::map<std::string, const ParamTensor*> ours;
    for (const ParamTensor& t : layout.tensors()) ours.emplace(hf_llama_name(t, mixtral), &t);
    for (const auto& [name, tensor] : weights.tensors()) {
        if (name.ends_with("rotary_emb.inv_freq")) continue;
        if (!ours.contains(name))
            throw Error(tensor.file->path() + ": unexpected tensor " + name +
                        " (the model has layers=" + std::to_string(layout.shape().layers) +
                        (layout.shape().tied ? ", tied embeddings" : "") +
                        "; check model.layers and model.tie_embeddings against the checkpoint)");
    }
    // Every shape before any data, so a wrong config fails at once.
    for (const auto& [name, t] : ours) {
        const HfWeights::Tensor* tensor = weights.find(name);
        if (!tensor)
            throw Error(path + ": missing tensor " + name + " (check model.layers and " +
                        "model.tie_embeddings against the checkpoint)");
        const io::TensorInfo& info = *tensor->info;
        if (!kernels::is_compute_type(info.dtype))
            throw Error(tensor->file->path() + ": " + name + " has dtype " +
                        std::string(io::safetensors_name(info.dtype)) +
                        ", expected F32, F16 or BF16");
        if (info.shape != hf_shape(*t, layout))
            throw Error(shape_mismatch(tensor->file->path(), info, hf_shape(*t, layout)));
    }
    for (const auto& [name, t] : ours) {
        const HfWeights::Tensor& tensor = *weights.find(name);
        float* dst = params + t->offset;
        tensor.file->read_f32(*tensor.info, std::span<float>(dst, tensor.info->numel));
        std::fill(dst + tensor.info->numel, dst + t->numel, 0.0f);  // padded vocabulary rows
    }
}

std::vector<io::TensorToWrite> to_hf_llama_tensors(const ParamLayout& layout, const float* params,
                                                   bool mixtral) {
    check_hf_family(layout.shape(), "export");
    std::vector<io::TensorToWrite> out;
    out.reserve(layout.tensors().size());
    for (const ParamTensor& t : layout.tensors())
        out.push_back({hf_llama_name(t, mixtral), hf_shape(t, layout), params + t.offset});
    return out;
}

}  // namespace trident::model
