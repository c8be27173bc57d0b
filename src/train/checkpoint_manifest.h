// A training checkpoint's manifest: what it holds and how to check it (see checkpoint.h for
// the directory's layout).
//
// manifest.json is one JSON object: the format and version; the progress (`step`: updates
// done, so training continues with 0-based step `step`; `samples_consumed` = step·B, the data
// position, since the sampler is a pure function of (seed, sample index); `seed`, which with
// the sample index fixes every dropout mask, so it and the step are the whole RNG state;
// Adam's step count; the loss scaler's scale and clean-step count; the skipped steps so far,
// and the step guard's state);
// the model's shape; the layout that wrote it (P, M, C, D, v, schedule, ZeRO stage, bucket
// size, context mode); the parameters' precision; every file with its grid coordinates (none
// for config.yaml), size and SHA-256; and the training and validation files the run read, each
// with its size and sampled SHA-256 (io/fingerprint.h), so a resume notices data that changed
// since. A run that trained low-rank adapters records them too (`lora`: rank, targets, alpha)
// and the base weights they adapt (path and SHA-256), since its shards hold the adapters
// alone. It is written last, so a directory whose manifest parses and whose files match it is
// complete. Its last member is its own SHA-256 (`manifest_sha256`, of its text without that
// member), so an edited manifest is refused as corrupt rather than read as another step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/param_layout.h"

namespace trident::train {

struct ManifestFile {
    std::string name;               // relative to the checkpoint directory
    int pp = -1, tp = -1, dp = -1;  // the rank that wrote it; -1: not a rank's shard
    uint64_t bytes = 0;
    std::string sha256;         // 64 hex digits
    std::string header_sha256;  // a shard's first 8 + N bytes; empty: not recorded
    int cp = 0;                 // the writer's context-parallel coordinate
};

// A training or validation file as it was when the checkpoint was written.
struct DataFileRecord {
    std::string key;  // its dataset's config key: data.train, data.valid, data.train[2], ...
    std::string path;
    uint64_t bytes = 0;
    std::string sampled_sha256;  // io::fingerprint_file
};

struct CheckpointLayout {
    int pipeline = 1, tensor = 1, data = 1, virtual_stages = 1;
    std::string schedule;  // as the config spells it
    int zero_stage = 1;
    int64_t bucket_size = 0;
    std::vector<int> chunk_layers;  // layers of each global pipeline chunk (P·v)
    int context = 1;
    std::string context_mode = "ring";  // as the config spells it

    // Where its chunks were: V-shaped for zb-v, else round robin.
    model::Placement placement() const;
};

// Low-rank adapters: what trained (rank 0: the whole model) and the frozen weights under them.
struct LoraRecord {
    int rank = 0;
    std::vector<std::string> targets;  // as training.lora.targets spells them
    double alpha = 0;
    std::string base;         // the base weights read: a file or a checkpoint directory
    std::string base_sha256;  // of that file, or of that checkpoint's manifest.json
};

struct Manifest {
    int step = 0;
    int64_t samples_consumed = 0;
    uint64_t seed = 0;
    int adam_step = 0;
    double loss_scale = 1;
    int good_steps = 0;
    int skipped_total = 0;
    // The step guard's state (train/step_guard.h): updates skipped in a row, and the losses and
    // gradient norms of the last applied steps that training.skip_spikes measures against.
    int skipped_in_a_row = 0;
    std::vector<double> recent_losses, recent_grad_norms;
    model::GptShape shape;  // padded_vocab as the writer's layout padded it
    CheckpointLayout layout;
    std::string precision;  // fp32 | bf16 | fp16
    std::vector<ManifestFile> files;
    std::vector<DataFileRecord> data;  // in the order the run reads them
    bool data_recorded = false;        // false: written before data was recorded
    LoraRecord lora;
};

inline constexpr const char* kManifestName = "manifest.json";

std::string manifest_json(const Manifest& m);
// Reads dir/manifest.json; throws trident::Error naming the file and what is wrong.
Manifest read_manifest(const std::string& dir);
// Checks every file the manifest lists, present and of its size, reading nothing; throws
// trident::Error naming the first bad file and why.
void verify_sizes(const std::string& dir, const Manifest& m);
// Checks config.yaml (a few kilobytes, read whole) against its SHA-256 in the manifest, before
// anything reads it: an edited seed is a corrupt checkpoint, not a changed run.
void verify_config(const std::string& dir, const Manifest& m);
// What is wrong with one file of the checkpoint in `dir`, its SHA-256 included: "" when it
// matches the manifest, else "MISSING", "WRONG SIZE (n bytes)" or "CORRUPT (checksum
// differs)".
std::string file_problem(const std::string& dir, const ManifestFile& f);

// What changed between the data files a checkpoint recorded (`then`) and those a run reads
// now, dataset by dataset (by config key; a dataset only one side has is not compared), as one
// message naming each changed file and how; "" when nothing did.
std::string describe_data_changes(const std::vector<DataFileRecord>& then,
                                  const std::vector<DataFileRecord>& now);

// The step_NNNNNN directories in `dir`, oldest first (complete or not: check them).
std::vector<std::string> list_checkpoints(const std::string& dir);
// "step_000400".
std::string checkpoint_name(int step);

}  // namespace trident::train
