// Model checkpoints (see model_checkpoint.h).
#include "train/model_checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "error.h"
#include "model/hf_gpt2.h"
#include "train/model_shape.h"

namespace trident::train {

namespace fs = std::filesystem;

namespace {

bool is_checkpoint_name(const std::string& name) {
    return name.size() == 11 && name.rfind("step_", 0) == 0 &&
           std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

std::vector<std::string> list_checkpoints(const std::string& dir) {
    std::vector<std::string> found;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec))
        if (entry.is_directory() && is_checkpoint_name(entry.path().filename().string()))
            found.push_back(entry.path().string());
    std::sort(found.begin(), found.end());  // zero-padded step numbers sort in step order
    return found;
}

std::string save_model_checkpoint(const config::Config& cfg, int step,
                                  const model::ParamLayout& layout, const float* params) {
    const fs::path dir(*cfg.checkpoint.dir);
    char name[32];
    std::snprintf(name, sizeof name, "step_%06d", step);
    const fs::path final_dir = dir / name;
    const fs::path tmp_dir = dir / (std::string(name) + ".tmp");
    fs::remove_all(tmp_dir);
    fs::create_directories(tmp_dir);
    model::save_hf_gpt2((tmp_dir / "model.safetensors").string(), layout, params);
    {
        std::ofstream out(tmp_dir / "config.yaml");
        out << config::to_yaml(cfg);
        if (!out) throw Error("cannot write " + (tmp_dir / "config.yaml").string());
    }
    fs::remove_all(final_dir);
    fs::rename(tmp_dir, final_dir);

    auto all = list_checkpoints(dir.string());
    const std::size_t keep = static_cast<std::size_t>(cfg.checkpoint.keep);
    for (std::size_t i = 0; i + keep < all.size(); ++i) fs::remove_all(all[i]);
    return final_dir.string();
}

LoadedModel load_model_checkpoint(const std::string& path) {
    fs::path dir(path);
    if (!fs::exists(dir / "model.safetensors")) {
        const auto all = list_checkpoints(path);
        if (all.empty())
            throw Error(path + ": no checkpoint here (expected model.safetensors, or step_* "
                               "directories holding one)");
        dir = all.back();
    }
    LoadedModel loaded;
    loaded.path = dir.string();
    loaded.cfg = config::load((dir / "config.yaml").string());
    const model::ParamLayout layout(gpt_shape(loaded.cfg));
    loaded.params.assign(layout.total(), 0.0f);
    model::load_hf_gpt2((dir / "model.safetensors").string(), layout, loaded.params.data());
    return loaded;
}

}  // namespace trident::train
