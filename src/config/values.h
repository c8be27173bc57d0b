// One config value between YAML and C++ (private to src/config/): reading a YAML node as an
// int, a number, a bool, a string or an enum with a message when it is not one, and writing a
// value back as YAML text that reads back to the same value.
#pragma once

#include <yaml-cpp/yaml.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "config/config.h"

namespace trident::config::detail {

// What is wrong with a value, as the tail of a message ("expected a number, got \"fast\""),
// or nothing when the value is fine.
using Problem = std::optional<std::string>;

// The YAML spelling of each enumerator: names[i] spells E(i).
template <typename E>
struct EnumNames;
template <>
struct EnumNames<pipeline::Kind> {  // as pipeline::to_string spells them
    static constexpr std::array names{"gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v"};
};
template <>
struct EnumNames<Arch> {
    static constexpr std::array names{"gpt2", "llama"};
};
template <>
struct EnumNames<ContextMode> {
    static constexpr std::array names{"ring", "ulysses"};
};
template <>
struct EnumNames<MoeRouter> {
    static constexpr std::array names{"softmax", "sigmoid"};
};
template <>
struct EnumNames<Decay> {
    static constexpr std::array names{"cosine", "linear", "constant"};
};
template <>
struct EnumNames<kernels::DType> {  // the compute types only, spelled as kernels::name_of does
    static constexpr std::array names{"fp32", "bf16", "fp16"};
};
template <>
struct EnumNames<Recompute> {
    static constexpr std::array names{"none", "selective", "full"};
};
template <>
struct EnumNames<NonFinite> {
    static constexpr std::array names{"stop", "skip"};
};
template <>
struct EnumNames<DeviceKind> {
    static constexpr std::array names{"auto", "cpu", "cuda"};
};

template <>
struct EnumNames<DataFormat> {
    static constexpr std::array names{"auto", "llmc", "megatron"};
};
template <>
struct EnumNames<DocumentMode> {
    static constexpr std::array names{"stream", "mask"};
};
template <>
struct EnumNames<LossNormalization> {
    static constexpr std::array names{"microbatch", "tokens"};
};
template <>
struct EnumNames<OnError> {
    static constexpr std::array names{"stop", "continue"};
};
template <>
struct EnumNames<Offload> {
    static constexpr std::array names{"none", "host", "nvme"};
};
template <>
struct EnumNames<OptimizerName> {
    static constexpr std::array names{"adamw", "muon", "galore"};
};
template <>
struct EnumNames<MuonScale> {
    static constexpr std::array names{"moonlight", "spectral"};
};
template <>
struct EnumNames<MuonNsDtype> {
    static constexpr std::array names{"fp32", "bf16"};
};
template <>
struct EnumNames<LoraQuantize> {
    static constexpr std::array names{"none", "nf4"};
};
template <>
struct EnumNames<LoraTarget> {
    static constexpr std::array names{"qkv", "attn_proj", "fc",   "fc_proj", "q",   "k",
                                      "v",   "o",         "gate", "up",      "down"};
};

template <typename E>
const char* enum_name(E value) {
    return EnumNames<E>::names.at(static_cast<size_t>(value));
}

// Edit distance counting a swap of neighbours as one edit (optimal string alignment).
size_t edit_distance(std::string_view a, std::string_view b);

// How a value looked, for "got ..." in messages: `null`, `a list`, `a map`, `3.5`, `"fast"`.
std::string describe(const YAML::Node& node);

// A number as the shortest text that reads back to the same double ("0.0006", "1e-08").
std::string format_number(double v);

// Each reader leaves `out` untouched and returns the problem when the node is not a value of
// that type.
Problem read_value(const YAML::Node& node, int& out);
Problem read_value(const YAML::Node& node, uint64_t& out);
Problem read_value(const YAML::Node& node, double& out);
Problem read_value(const YAML::Node& node, bool& out);
Problem read_value(const YAML::Node& node, std::string& out);
Problem read_value(const YAML::Node& node, std::optional<std::string>& out);

// A dataset key: a path (one dataset of weight 1) or a list of {path, weight} items; null
// gives no datasets where `nullable`. A problem inside an item sets `at` to the place of the
// item (or of its key at fault), so the message can point at that line.
Problem read_sources(const YAML::Node& node, std::vector<DataSource>& out, bool nullable,
                     YAML::Mark& at);
// parallel.stage_layers: uniform, auto, or a list of layer counts (each >= 0).
Problem read_value(const YAML::Node& node, StageLayers& out);
// training.lora.targets: a non-empty list of distinct target names, in the order given. A
// problem with an item sets `at` to its place.
Problem read_value(const YAML::Node& node, std::vector<LoraTarget>& out, YAML::Mark& at);

template <typename E>
requires std::is_enum_v<E> Problem read_value(const YAML::Node& node, E& out) {
    const auto& names = EnumNames<E>::names;
    if (node.IsScalar()) {
        for (size_t i = 0; i < names.size(); ++i) {
            if (node.Scalar() == names[i]) {
                out = static_cast<E>(i);
                return {};
            }
        }
    }
    std::string allowed;
    for (const char* name : names) allowed += (allowed.empty() ? "" : ", ") + std::string(name);
    return "expected one of " + allowed + "; got " + describe(node);
}

// optimizer.name: as any enum, with the nearest name suggested when one is near.
Problem read_value(const YAML::Node& node, OptimizerName& out);

// Writers: YAML scalar text that the readers above turn back into the same value.
std::string yaml_text(int v);
std::string yaml_text(uint64_t v);
std::string yaml_text(double v);
std::string yaml_text(bool v);
std::string yaml_text(const std::string& v);
std::string yaml_text(const std::optional<std::string>& v);
// No datasets: null; one of weight 1: its path; else a flow list of {path, weight}.
std::string yaml_text(const std::vector<DataSource>& v);
std::string yaml_text(const StageLayers& v);  // uniform, auto, or a flow list of counts
// A flow list of target names: [qkv, fc].
std::string yaml_text(const std::vector<LoraTarget>& v);

template <typename E>
requires std::is_enum_v<E> std::string yaml_text(E v) {
    return enum_name(v);
}

}  // namespace trident::config::detail
