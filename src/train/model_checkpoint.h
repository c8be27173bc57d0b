// Model checkpoints: the trained weights and the config that shaped them, in a directory.
//
// checkpoint.dir/step_000400/ holds model.safetensors (Hugging Face GPT-2 layout, fp32) and
// config.yaml (every key). A checkpoint is written under a temporary name and renamed into
// place when complete, so a directory named step_* is always whole; the newest
// checkpoint.keep are kept.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "model/param_layout.h"

namespace trident::train {

// Writes the checkpoint of `step` (1-based) and prunes older ones beyond cfg.checkpoint.keep.
// Returns its directory.
std::string save_model_checkpoint(const config::Config& cfg, int step,
                                  const model::ParamLayout& layout, const float* params);

// The complete checkpoints in `dir`, oldest first.
std::vector<std::string> list_checkpoints(const std::string& dir);

struct LoadedModel {
    config::Config cfg;
    std::vector<float> params;  // host, layout of the config's model
    std::string path;           // the checkpoint directory it came from
};

// Loads a checkpoint directory, or the newest checkpoint inside a checkpoint.dir.
LoadedModel load_model_checkpoint(const std::string& path);

}  // namespace trident::train
