// A Hugging Face folder's weights, one file or shards with their index (see hf_weights.h).
#include "model/hf_weights.h"

#include <cstdio>
#include <filesystem>
#include <set>

#include "io/json_line.h"
#include "io/output_file.h"
#include "kernels/error.h"
#include "model/hf_config.h"

namespace trident::model {

namespace {

namespace fs = std::filesystem;

// The index's weight_map: tensor name -> shard file name.
std::map<std::string, std::string> read_weight_map(const std::string& index) {
    const io::json::Value root = read_hf_config_file(index);
    const io::json::Value* map = root.find("weight_map");
    if (!map || !map->is_object()) throw Error(index + ": no \"weight_map\" object");
    std::map<std::string, std::string> shards;
    for (const io::json::Member& m : map->object) {
        // A plain name inside the folder: never a path that leaves it.
        const std::string& shard = m.value.string;  // "" unless a string
        if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
            throw Error(index + ": weight_map's " + m.key +
                        " does not name a shard file in the folder");
        shards.emplace(m.key, shard);
    }
    if (shards.empty()) throw Error(index + ": weight_map names no tensor");
    return shards;
}

// Element bytes of one tensor to write.
uint64_t bytes_of(const io::TensorToWrite& t) {
    uint64_t n = kernels::size_of(t.dtype);
    for (const int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    return n;
}

std::string shard_name(std::size_t i, std::size_t n) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, n);
    return name;
}

}  // namespace

const HfWeights::Tensor* HfWeights::find(const std::string& name) const {
    const auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
}

HfWeights HfWeights::open(const std::string& path) {
    HfWeights w;
    w.path_ = path;
    const auto add_file = [&](const std::string& file) -> const io::SafetensorsFile& {
        return *w.files_.emplace_back(
            std::make_unique<io::SafetensorsFile>(io::SafetensorsFile::open(file)));
    };
    if (!fs::is_directory(path)) {
        const io::SafetensorsFile& file = add_file(path);
        for (const io::TensorInfo& info : file.tensors()) w.tensors_[info.name] = {&file, &info};
        return w;
    }
    const std::string single = (fs::path(path) / kHfWeightsName).string();
    const std::string index = (fs::path(path) / kHfIndexName).string();
    const bool has_single = fs::exists(single), has_index = fs::exists(index);
    if (has_single && has_index)
        throw Error(path + " holds both " + kHfWeightsName + " and " + kHfIndexName +
                    ": which weights are meant? remove the stale one");
    if (!has_single && !has_index)
        throw Error(path + " holds neither " + std::string(kHfWeightsName) + " nor " +
                    kHfIndexName + ": not a Hugging Face model folder");
    if (has_single) return open(single);
    const std::map<std::string, std::string> weight_map = read_weight_map(index);
    std::map<std::string, const io::SafetensorsFile*> shards;
    for (const auto& [name, shard] : weight_map) {
        if (shards.contains(shard)) continue;
        const std::string file = (fs::path(path) / shard).string();
        if (!fs::exists(file))
            throw Error(index + " names shard " + shard + " (of " + name +
                        "), which is missing from " + path);
        shards.emplace(shard, &add_file(file));
    }
    for (const auto& [shard, file] : shards)
        for (const io::TensorInfo& info : file->tensors()) {
            const auto it = weight_map.find(info.name);
            if (it == weight_map.end() || it->second != shard)
                throw Error(file->path() + " holds " + info.name + ", which " + index +
                            (it == weight_map.end() ? " does not name" : " puts in " + it->second));
            w.tensors_[info.name] = {file, &info};
        }
    for (const auto& [name, shard] : weight_map)
        if (!w.tensors_.contains(name))
            throw Error(index + " puts " + name + " in " + shard + ", which does not hold it");
    return w;
}

std::vector<std::string> write_hf_weights(const std::string& dir,
                                          std::span<const io::TensorToWrite> tensors,
                                          uint64_t shard_bytes) {
    // Greedy in order: a shard takes tensors until the next would pass shard_bytes.
    std::vector<std::vector<io::TensorToWrite>> shards(1);
    uint64_t filled = 0, total = 0;
    for (const io::TensorToWrite& t : tensors) {
        const uint64_t bytes = bytes_of(t);
        if (!shards.back().empty() && filled + bytes > shard_bytes) {
            shards.emplace_back();
            filled = 0;
        }
        shards.back().push_back(t);
        filled += bytes;
        total += bytes;
    }
    const std::map<std::string, std::string> format = {{"format", "pt"}};
    if (shards.size() == 1) {
        const std::string file = (fs::path(dir) / kHfWeightsName).string();
        io::write_safetensors(file, tensors, format);
        return {file};
    }
    std::vector<std::string> written;
    io::JsonLine weight_map;
    for (std::size_t i = 0; i < shards.size(); ++i) {
        const std::string name = shard_name(i, shards.size());
        written.push_back((fs::path(dir) / name).string());
        io::write_safetensors(written.back(), shards[i], format);
        for (const io::TensorToWrite& t : shards[i]) weight_map.add(t.name, name);
    }
    io::JsonLine metadata;
    metadata.add("total_size", static_cast<int64_t>(total));
    io::JsonLine index;
    index.add("metadata", metadata).add("weight_map", weight_map);
    written.push_back((fs::path(dir) / kHfIndexName).string());
    io::write_file_atomically(written.back(), index.str() + "\n");
    return written;
}

}  // namespace trident::model
