// The weights a run starts from (model.init_from): a Hugging Face GPT-2 safetensors file or a
// Trident checkpoint (a directory holding manifest.json, or a checkpoint.dir whose newest
// usable one is taken), and their identity, which a run that trains low-rank adapters records
// in its checkpoints (the adapters mean nothing over other weights).
#pragma once

#include <string>

#include "model/param_layout.h"

namespace trident::train {

// Fills `params` (whole.total() floats, zero) with the weights at `from` for the model of
// `whole` (one stage, tensor size 1); a checkpoint's padded vocabulary rows past the model's
// own stay zero. Returns what was read: the file, or the checkpoint directory. Throws
// trident::Error naming the file when it is unreadable or of another model.
std::string load_base_weights(const std::string& from, const model::ParamLayout& whole,
                              float* params);

// The identity of what load_base_weights read: the SHA-256 of the file, or of the
// checkpoint's manifest.json (which holds the SHA-256 of every shard).
std::string base_weights_sha256(const std::string& read);

}  // namespace trident::train
