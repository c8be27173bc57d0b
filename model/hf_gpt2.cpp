// Hugging Face GPT-2 import and export of model/hf_gpt2.h.
#include "model/hf_gpt2.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <map>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "io/safetensors.h"
#include "kernels/error.h"
#include "model/hf_names.h"

namespace trident::model {

namespace {

constexpr std::string_view kPrefix = "transformer.";

// HF's Conv1D weights (c_attn, c_proj, c_fc): every matrix inside a block.
bool is_conv1d_weight(const ParamTensor& t) {
    return t.name.starts_with("h.") && t.shape.size() == 2;
}

// h.<N>.attn.bias and h.<N>.attn.masked_bias: HF's causal-mask buffers, not parameters.
bool is_mask_buffer(std::string_view name) {
    if (!name.starts_with("h.")) return false;
    name.remove_prefix(2);
    const std::size_t digits = name.find_first_not_of("0123456789");
    if (digits == 0 || digits == std::string_view::npos) return false;
    name.remove_prefix(digits);
    return name == ".attn.bias" || name == ".attn.masked_bias";
}

// src is (rows, cols) row-major; dst becomes (cols, rows).
void transpose(const float* src, float* dst, std::size_t rows, std::size_t cols) {
    for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
}

// The HF shape of one of our tensors: Conv1D weights transposed, wte unpadded.
std::vector<int64_t> hf_shape(const ParamTensor& t, const ParamLayout& layout) {
    if (t.name == "wte.weight") return {layout.shape().vocab, layout.shape().hidden};
    if (is_conv1d_weight(t)) return {t.shape[1], t.shape[0]};
    return t.shape;
}

// The config keys a tensor's shape depends on, with their values, for messages.
std::vector<std::pair<std::string, int>> sizes_of(const ParamTensor& t, const GptShape& s) {
    if (t.name == "wte.weight") return {{"vocab_size", s.vocab}, {"hidden", s.hidden}};
    if (t.name == "wpe.weight") return {{"seq_len", s.max_seq}, {"hidden", s.hidden}};
    if (t.name.find(".mlp.c_fc.") != std::string::npos || t.name.ends_with(".mlp.c_proj.weight"))
        return {{"hidden", s.hidden}, {"ffn_hidden", s.ffn}};
    return {{"hidden", s.hidden}};
}

// "for hidden=384, ffn_hidden=1536 (check model.hidden/ffn_hidden against the checkpoint)"
std::string config_hint(const ParamTensor& t, const GptShape& s) {
    std::string values, keys;
    for (const auto& [key, value] : sizes_of(t, s)) {
        if (!values.empty()) {
            values += ", ";
            keys += '/';
        }
        values += key + "=" + std::to_string(value);
        keys += key;
    }
    return "for " + values + " (check model." + keys + " against the checkpoint)";
}

std::string list_names(const std::vector<std::string>& names) {
    constexpr std::size_t kShown = 6;
    std::string s;
    for (std::size_t i = 0; i < std::min(names.size(), kShown); ++i) {
        if (i) s += ", ";
        s += names[i];
    }
    if (names.size() > kShown) s += " and " + std::to_string(names.size() - kShown) + " more";
    return s;
}

void check_float_dtype(const io::SafetensorsFile& file, const io::TensorInfo& info) {
    if (!kernels::is_compute_type(info.dtype))
        throw Error(file.path() + ": " + info.name + " has dtype " +
                    std::string(io::safetensors_name(info.dtype)) + ", expected F32, F16 or BF16");
}

// A checkpoint's tensors by our name (its prefix dropped); lm_head apart.
using TensorsByName = std::map<std::string, const io::TensorInfo*, std::less<>>;
struct FileTensors {
    TensorsByName by_name;
    const io::TensorInfo* lm_head = nullptr;
};

// The file's tensors by our name; HF's mask buffers left out.
FileTensors index_tensors(const io::SafetensorsFile& file, const std::string& path) {
    FileTensors found;
    for (const auto& info : file.tensors()) {
        std::string_view name = info.name;
        if (name.starts_with(kPrefix)) name.remove_prefix(kPrefix.size());
        if (is_mask_buffer(name)) continue;
        if (name == "lm_head.weight") {
            found.lm_head = &info;
            continue;
        }
        const auto [it, inserted] = found.by_name.emplace(std::string(name), &info);
        if (!inserted)
            throw Error(path + ": both " + it->second->name + " and " + info.name +
                        " are present; a checkpoint has each tensor once");
    }
    return found;
}

// The file has every tensor of the model and no other.
void check_names(const TensorsByName& by_name, const ParamLayout& layout, const std::string& path) {
    const GptShape& s = layout.shape();
    std::vector<std::string> missing, unexpected;
    for (const auto& t : layout.tensors())
        if (!by_name.contains(t.name)) missing.push_back(t.name);
    for (const auto& [name, info] : by_name)
        if (!layout.find(name)) unexpected.push_back(info->name);
    if (!missing.empty())
        throw Error(path + ": missing " + std::to_string(missing.size()) +
                    " tensor(s): " + list_names(missing) +
                    " (is this a GPT-2 checkpoint with layers=" + std::to_string(s.layers) +
                    "? check model.layers against the checkpoint)");
    if (!unexpected.empty())
        throw Error(
            path + ": unexpected " + std::to_string(unexpected.size()) + " tensor(s): " +
            list_names(unexpected) + " (the model has layers=" + std::to_string(s.layers) +
            "; check model.layers against the checkpoint, or is it not a GPT-2 checkpoint?)");
}

// Every tensor's dtype and shape, checked before any data is read so that a wrong config
// fails at once.
void check_shapes(const io::SafetensorsFile& file, const TensorsByName& by_name,
                  const ParamLayout& layout, const std::string& path) {
    for (const auto& t : layout.tensors()) {
        const io::TensorInfo& info = *by_name.find(t.name)->second;
        check_float_dtype(file, info);
        const std::vector<int64_t> expected = hf_shape(t, layout);
        const bool is_wpe = t.name == "wpe.weight";
        // wpe may hold more positions than we train with: we take the first max_seq rows.
        const bool ok = is_wpe ? info.shape.size() == 2 && info.shape[0] >= expected[0] &&
                                     info.shape[1] == expected[1]
                               : info.shape == expected;
        if (!ok)
            throw Error(path + ": " + info.name + " has shape " + io::shape_string(info.shape) +
                        ", expected " + io::shape_string(expected) +
                        (is_wpe ? " or more rows " : " ") + config_hint(t, layout.shape()));
    }
}

// Reads every tensor into its place in `params`, in our layout; `scratch` holds those that
// need rearranging.
void read_tensors(const io::SafetensorsFile& file, const TensorsByName& by_name,
                  const ParamLayout& layout, float* params, std::vector<float>& scratch) {
    for (const auto& t : layout.tensors()) {
        const io::TensorInfo& info = *by_name.find(t.name)->second;
        float* dst = params + t.offset;
        if (t.name == "wte.weight") {
            const std::size_t real = info.numel;  // (V, H); rows V..Vp stay zero
            file.read_f32(info, std::span<float>(dst, real));
            std::fill(dst + real, dst + t.numel, 0.0f);
        } else if (t.name == "wpe.weight" && info.numel != t.numel) {
            scratch.resize(info.numel);
            file.read_f32(info, scratch);
            std::copy_n(scratch.begin(), t.numel, dst);  // the first max_seq rows
        } else if (is_conv1d_weight(t)) {
            scratch.resize(info.numel);  // HF (in, out) -> ours (out, in)
            file.read_f32(info, scratch);
            transpose(scratch.data(), dst, static_cast<std::size_t>(info.shape[0]),
                      static_cast<std::size_t>(info.shape[1]));
        } else {
            file.read_f32(info, std::span<float>(dst, t.numel));
        }
    }
}

// A stored lm_head is fine only as a copy of wte (already read into `params`): Trident has no
// separate output matrix.
void check_tied_head(const io::SafetensorsFile& file, const io::TensorInfo& lm_head,
                     const ParamLayout& layout, const float* params, std::vector<float>& scratch) {
    const GptShape& s = layout.shape();
    const std::string& path = file.path();
    check_float_dtype(file, lm_head);
    const std::vector<int64_t> expected = {s.vocab, s.hidden};
    if (lm_head.shape != expected)
        throw Error(path + ": " + lm_head.name + " has shape " + io::shape_string(lm_head.shape) +
                    ", expected " + io::shape_string(expected) + " for vocab_size=" +
                    std::to_string(s.vocab) + ", hidden=" + std::to_string(s.hidden));
    scratch.resize(lm_head.numel);
    file.read_f32(lm_head, scratch);
    if (std::memcmp(scratch.data(), params + layout.wte(), scratch.size() * sizeof(float)) != 0)
        throw Error(path + ": " + lm_head.name +
                    " differs from wte.weight, but Trident ties the LM head to the token "
                    "embedding; an untied checkpoint cannot be loaded");
}

}  // namespace

void load_hf_gpt2(const std::string& path, const ParamLayout& layout, float* params) {
    check_hf_family(layout.shape(), "import");
    const io::SafetensorsFile file = io::SafetensorsFile::open(path);
    const FileTensors found = index_tensors(file, path);
    check_names(found.by_name, layout, path);
    check_shapes(file, found.by_name, layout, path);
    std::vector<float> scratch;
    read_tensors(file, found.by_name, layout, params, scratch);
    if (found.lm_head) check_tied_head(file, *found.lm_head, layout, params, scratch);
}

GptShape infer_hf_gpt2_shape(const std::string& path, int head_dim) {
    const io::SafetensorsFile file = io::SafetensorsFile::open(path);
    const auto shape_of = [&](const std::string& name) -> const std::vector<int64_t>& {
        const io::TensorInfo* t = file.find(name);
        if (!t) t = file.find(std::string(kPrefix) + name);
        if (!t || t->shape.size() != 2)
            throw Error(path + ": no 2-D tensor " + name + ": not a GPT-2 checkpoint?");
        return t->shape;
    };
    GptShape s;
    s.vocab = static_cast<int>(shape_of("wte.weight")[0]);
    s.hidden = static_cast<int>(shape_of("wte.weight")[1]);
    s.max_seq = static_cast<int>(shape_of("wpe.weight")[0]);
    s.ffn = static_cast<int>(shape_of("h.0.mlp.c_fc.weight")[1]);
    for (const auto& t : file.tensors()) {
        std::string_view name = t.name;
        if (name.starts_with(kPrefix)) name.remove_prefix(kPrefix.size());
        if (!name.starts_with("h.")) continue;
        name.remove_prefix(2);
        int layer = 0;
        const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), layer);
        if (ec != std::errc() || end == name.data() || *end != '.')
            throw Error(path + ": tensor " + t.name + " does not name a layer as h.N.*");
        s.layers = std::max(s.layers, layer + 1);
    }
    if (s.hidden % head_dim != 0)
        throw Error(path + ": hidden size " + std::to_string(s.hidden) +
                    " is not a multiple of the head size " + std::to_string(head_dim));
    s.heads = s.hidden / head_dim;
    s.kv_heads = s.heads;
    s.padded_vocab = (s.vocab + 127) / 128 * 128;
    return s;
}

HfTensors to_hf_tensors(const ParamLayout& layout, const float* params) {
    check_hf_family(layout.shape(), "export");
    HfTensors hf;
    hf.transposed.reserve(layout.tensors().size());
    for (const auto& t : layout.tensors()) {
        io::TensorToWrite out{std::string(kPrefix) + t.name, hf_shape(t, layout),
                              params + t.offset};
        if (is_conv1d_weight(t)) {  // ours (out, in) -> HF (in, out)
            auto& copy = hf.transposed.emplace_back(t.numel);
            transpose(params + t.offset, copy.data(), static_cast<std::size_t>(t.shape[0]),
                      static_cast<std::size_t>(t.shape[1]));
            out.data = copy.data();
        }
        hf.tensors.push_back(std::move(out));
    }
    return hf;
}

void save_hf_gpt2(const std::string& path, const ParamLayout& layout, const float* params) {
    const HfTensors hf = to_hf_tensors(layout, params);
    io::write_safetensors(path, hf.tensors, {{"format", "pt"}});
}

}  // namespace trident::model
