// The weights of a Hugging Face model folder, as transformers' save_pretrained writes them:
// DIR/model.safetensors, or shards DIR/model-0000i-of-0000n.safetensors with
// DIR/model.safetensors.index.json, whose "weight_map" names the shard of every tensor. Read
// as one set of tensors by name, whichever form; written in either.
//
// The index is held to the shards exactly: every shard it names exists, every tensor it names
// is in the shard it names, and no shard holds a tensor it does not name (a stale or mixed
// folder would otherwise load weights from two models). A shard is a plain file name inside
// the folder.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace trident::model {

inline constexpr const char* kHfWeightsName = "model.safetensors";
inline constexpr const char* kHfIndexName = "model.safetensors.index.json";
// transformers' save_pretrained shards above 5 GB by default (max_shard_size "5GB").
inline constexpr uint64_t kHfShardBytes = 5'000'000'000;

class HfWeights {
public:
    // `path`: one .safetensors file, or a folder as above. Throws trident::Error naming the
    // file at fault.
    static HfWeights open(const std::string& path);

    struct Tensor {
        const io::SafetensorsFile* file = nullptr;
        const io::TensorInfo* info = nullptr;
    };
    const std::string& path() const { return path_; }
    const std::map<std::string, Tensor>& tensors() const { return tensors_; }
    const Tensor* find(const std::string& name) const;  // nullptr if absent

private:
    std::string path_;
    std::vector<std::unique_ptr<io::SafetensorsFile>> files_;
    std::map<std::string, Tensor> tensors_;
};

// Writes `tensors` into folder `dir` (which must exist): one model.safetensors if their data
// fits in `shard_bytes`, else shards of at most that much each (a larger tensor alone in its
// own) and the index. Metadata {"format": "pt"}, as transformers writes. Returns the files
// written, the index last.
std::vector<std::string> write_hf_weights(const std::string& dir,
                                          std::span<const io::TensorToWrite> tensors,
                                          uint64_t shard_bytes = kHfShardBytes);

}  // namespace trident::model
