// Low-rank adapters on the host: initialisation, files, merging (see lora.h).
#include "model/lora.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <span>

#include "io/safetensors.h"
#include "kernels/error.h"
#include "kernels/random.h"
#include "model/hf_names.h"

namespace trident::model {

namespace {

// Initial adapters draw from a stream of their own, apart from the model's initialisation.
constexpr uint64_t kLoraStream = 0x6C6F7261ull;  // "lora"

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() &&
           s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Where a linear's weight is in the whole model: "h.3.attn.c_attn.lora_A.weight" adapts
// "h.3.attn.c_attn.weight".
std::string adapted_weight(const std::string& adapter_name) {
    const std::size_t at = adapter_name.find(".lora_");
    return adapter_name.substr(0, at) + ".weight";
}

std::string shape_text(const std::vector<int64_t>& shape) {
    return io::shape_string(shape);
}

}  // namespace

LoraFileInfo read_lora_info(const std::string& path) {
    const io::SafetensorsFile file = io::SafetensorsFile::open(path);
    const auto& meta = file.metadata();
    const auto value = [&](const char* key) {
        const auto it = meta.find(key);
        if (it == meta.end())
            throw Error(path + ": no \"" + key +
                        "\" in the metadata (not an adapters file trident wrote)");
        return it->second;
    };
    LoraFileInfo info;
    try {
        info.lora.rank = std::stoi(value("lora_rank"));
        info.alpha = std::stod(value("lora_alpha"));
    } catch (const std::logic_error&) {
        throw Error(path + ": lora_rank or lora_alpha in the metadata is not a number");
    }
    const std::string targets = value("lora_targets");
    std::size_t begin = 0;
    while (begin <= targets.size()) {
        const std::size_t end = std::min(targets.find(',', begin), targets.size());
        const std::string name = targets.substr(begin, end - begin);
        bool known = false;
        for (int i = 0; i < kLoraTargets; ++i)
            if (name == lora_target_name(static_cast<LoraTarget>(i))) {
                info.lora.targets[static_cast<std::size_t>(i)] = true;
                known = true;
            }
        if (!known) throw Error(path + ": unknown adapter target \"" + name + "\" in the metadata");
        begin = end + 1;
    }
    if (info.lora.rank < 1) throw Error(path + ": lora_rank in the metadata is not positive");
    return info;
}

std::vector<float> initial_lora(const ParamLayout& whole_lora, uint64_t seed) {
    std::vector<float> values(whole_lora.total(), 0.0f);
    const auto& tensors = whole_lora.tensors();
    for (std::size_t ti = 0; ti < tensors.size(); ++ti) {
        const ParamTensor& t = tensors[ti];
        if (t.init != Init::fan_in_uniform) continue;  // B stays zero
        // torch.nn.init.kaiming_uniform_(a=sqrt(5)): bound = sqrt(6 / ((1 + a²)·fan_in)).
        const double bound = 1.0 / std::sqrt(static_cast<double>(t.full_shape[1]));
        const uint64_t tensor_seed = kernels::hash64(seed ^ kLoraStream, ti);
        for (std::size_t i = 0; i < t.numel; ++i)
            values[t.offset + i] =
                static_cast<float>(bound * (2.0 * kernels::uniform_open(tensor_seed, i) - 1.0));
    }
    return values;
}

void load_lora_file(const std::string& path, const ParamLayout& whole_lora, float* values) {
    const io::SafetensorsFile file = io::SafetensorsFile::open(path);
    const std::string prefix = peft_prefix(whole_lora.shape().arch);
    std::set<std::string> taken;
    for (const ParamTensor& t : whole_lora.tensors()) {
        const io::TensorInfo* info = file.find(prefix + t.name);
        if (!info) info = file.find(t.name);
        if (!info)
            throw Error(path + ": no adapter \"" + prefix + t.name +
                        "\" (training.lora.targets and rank must match the file's)");
        if (info->shape != t.full_shape)
            throw Error(path + ": adapter \"" + info->name + "\" is " + shape_text(info->shape) +
                        ", the model's is " + shape_text(t.full_shape) +
                        " (training.lora.rank must match the file's)");
        file.read_f32(*info, std::span<float>(values + t.offset, t.numel));
        taken.insert(info->name);
    }
    for (const io::TensorInfo& info : file.tensors())
        if (!taken.count(info.name))
            throw Error(path + ": tensor \"" + info.name +
                        "\" is not an adapter training.lora asks for (targets, layers)");
}

void save_lora_file(const std::string& path, const ParamLayout& whole_lora, const float* values,
                    double alpha) {
    std::vector<io::TensorToWrite> tensors;
    for (const ParamTensor& t : whole_lora.tensors())
        tensors.push_back(
            {peft_prefix(whole_lora.shape().arch) + t.name, t.full_shape, values + t.offset});
    std::string targets;
    for (int i = 0; i < kLoraTargets; ++i)
        if (whole_lora.lora().targets[static_cast<std::size_t>(i)])
            targets += std::string(targets.empty() ? "" : ",") +
                       lora_target_name(static_cast<LoraTarget>(i));
    char alpha_text[32];
    std::snprintf(alpha_text, sizeof(alpha_text), "%.17g", alpha);
    io::write_safetensors(path, tensors,
                          {{"format", "pt"},
                           {"lora_rank", std::to_string(whole_lora.lora().rank)},
                           {"lora_alpha", alpha_text},
                           {"lora_targets", targets}});
}

void merge_lora(const ParamLayout& whole_model, float* params, const ParamLayout& whole_lora,
                const float* adapters, float scale) {
    const std::size_t r = static_cast<std::size_t>(whole_lora.lora().rank);
    const auto& tensors = whole_lora.tensors();
    for (std::size_t i = 0; i + 1 < tensors.size(); i += 2) {  // A then B, per adapter
        const ParamTensor& a = tensors[i];
        const ParamTensor& b = tensors[i + 1];
        const ParamTensor* w = whole_model.find(adapted_weight(a.name));
        if (!w || !ends_with(a.name, "lora_A.weight") || !ends_with(b.name, "lora_B.weight"))
            throw Error("internal: adapter " + a.name + " of no weight");
        const std::size_t out = static_cast<std::size_t>(w->full_shape[0]);
        const std::size_t in = static_cast<std::size_t>(w->full_shape[1]);
        // W (out, in) += scale · B (out, r) · A (r, in), each sum in double.
        for (std::size_t o = 0; o < out; ++o)
            for (std::size_t j = 0; j < in; ++j) {
                double sum = 0;
                for (std::size_t k = 0; k < r; ++k)
                    sum += static_cast<double>(adapters[b.offset + o * r + k]) *
                           adapters[a.offset + k * in + j];
                params[w->offset + o * in + j] += static_cast<float>(scale * sum);
            }
    }
}

}  // namespace trident::model
