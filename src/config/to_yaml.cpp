// A config written back as YAML, every key included, so a run's exact settings can be saved
// beside its results and loaded again to repeat it.
#include "config/schema.h"

namespace trident::config {

std::string to_yaml(const Config& cfg) {
    std::string out = "# Trident config: every key, as resolved";
    if (!cfg.source.empty()) out += " from " + cfg.source;
    out += "\n";
    std::string_view current_section;
    for (const detail::Key& key : detail::keys()) {
        if (key.deprecated) continue;  // its value is in its successor's
        std::string_view section = detail::section_of(key.path);
        if (section.empty()) {
            out += std::string(key.path) + ": " + key.write(cfg) + "\n";
            continue;
        }
        if (section != current_section) {
            out += std::string(section) + ":\n";
            current_section = section;
        }
        out += "  " + std::string(detail::leaf_of(key.path)) + ": " + key.write(cfg) + "\n";
    }
    return out;
}

const char* to_string(Arch v) {
    return detail::enum_name(v);
}
const char* to_string(ContextMode v) {
    return detail::enum_name(v);
}
const char* to_string(Decay v) {
    return detail::enum_name(v);
}
const char* to_string(Recompute v) {
    return detail::enum_name(v);
}
const char* to_string(NonFinite v) {
    return detail::enum_name(v);
}
const char* to_string(DeviceKind v) {
    return detail::enum_name(v);
}
const char* to_string(DataFormat v) {
    return detail::enum_name(v);
}
const char* to_string(DocumentMode v) {
    return detail::enum_name(v);
}
const char* to_string(LossNormalization v) {
    return detail::enum_name(v);
}
const char* to_string(OnError v) {
    return detail::enum_name(v);
}
const char* to_string(OptimizerName v) {
    return detail::enum_name(v);
}
const char* to_string(Offload v) {
    return detail::enum_name(v);
}
const char* to_string(LoraTarget v) {
    return detail::enum_name(v);
}
const char* to_string(LoraQuantize v) {
    return detail::enum_name(v);
}
std::string to_string(const StageLayers& v) {
    return detail::yaml_text(v);
}

std::string layout_text(int pipeline, int tensor, int context, int data) {
    const int ranks = pipeline * tensor * context * data;
    return std::to_string(pipeline) + " x " + std::to_string(tensor) + " x " +
           std::to_string(context) + " x " + std::to_string(data) +
           " (pipeline x tensor x context x data) = " + std::to_string(ranks) +
           (ranks == 1 ? " rank" : " ranks");
}

}  // namespace trident::config
