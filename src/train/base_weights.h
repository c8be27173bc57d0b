// The weights a run starts from (model.init_from): a Hugging Face safetensors file (GPT-2 or
// Llama, as model.arch says), a Hugging Face model folder (one holding config.json, whose
// shapes config/hf_folder.cpp has already taken; model/hf_weights.h), or a Trident checkpoint (a
// directory holding manifest.json, or a checkpoint.dir whose newest usable one is taken), and their
// identity, which a run that trains low-rank adapters records in its checkpoints (the adapters mean
// nothing over other weights): where they are, relative to the checkpoint recording them (so that a
// tree of runs can move), and a pin in a base checkpoint that keeps checkpoint.keep's rotation from
// removing it.
#pragma once

#include <string>
#include <vector>

#include "model/param_layout.h"

namespace trident::train {

// Fills `params` (whole.total() floats, zero) with the weights at `from` for the model of
// `whole` (one stage, tensor size 1); a checkpoint's padded vocabulary rows past the model's
// own stay zero. Returns what was read: the file, or the checkpoint directory. Throws
// trident::Error naming the file when it is unreadable or of another model.
std::string load_base_weights(const std::string& from, const model::ParamLayout& whole,
                              float* params);

// The identity of what load_base_weights read: the SHA-256 of the file, of the checkpoint's
// manifest.json (which holds the SHA-256 of every shard), or of a Hugging Face folder's
// .json and .safetensors files' SHA-256s.
std::string base_weights_sha256(const std::string& read);

// `base` (what load_base_weights read) as a checkpoint written to `checkpoint_dir` records it:
// relative to that directory. resolve_base turns the record back into a path.
std::string base_relative_to(const std::string& base, const std::string& checkpoint_dir);
std::string resolve_base(const std::string& recorded, const std::string& checkpoint_dir);

// The pin of a checkpoint that adapters are trained over: a file in it naming each run
// (checkpoint.dir) that trains them. pin_base adds `run` (atomically; once); pinned_by lists
// them (none: not pinned).
inline constexpr const char* kPinName = "adapters_over_this.txt";
void pin_base(const std::string& checkpoint, const std::string& run);
std::vector<std::string> pinned_by(const std::string& checkpoint);

}  // namespace trident::train
