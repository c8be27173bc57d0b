// Training checkpoints: every rank's shard of the model and of the optimizer, written together,
// checked on load, and loadable into any P×M×D layout of the same model.
//
//   checkpoint.dir/
//     step_000400/                  a complete checkpoint (400 updates done)
//       manifest.json               written last: progress, model, layout, files and their
//                                   SHA-256 (checkpoint_manifest.h)
//       config.yaml                 the run's config, every key
//       pp0_tp0_dp0.safetensors     one shard per rank, named by its grid coordinates
//       ...
//     .tmp_step_000800/             a save under way, or one a crash interrupted (removed by
//                                   the next save; never read)
//
// A shard holds, under the whole model's tensor names (model/param_layout.h):
//   param/NAME                      the rank's slice of the tensor as the model holds it
//                                   (F32, BF16 or F16), from data-parallel rank 0
//   master/NAME/LO, exp_avg/NAME/LO, exp_avg_sq/NAME/LO
//                                   fp32 master weights and Adam's moments of elements LO.. of
//                                   that slice: the part of it the rank owns under ZeRO-1
// Tensors several ranks hold are written by one: replicated ones (LayerNorms, row-parallel
// biases, wpe) by tensor rank 0, the tied wte by the first stage, and with zero_stage 0 (every
// replica holds the whole optimizer state) the optimizer state by data-parallel rank 0. So each
// element of the model is written exactly once, and where it lies in the whole tensor follows
// from the writer's tensor rank and the tensor's split (model::full_element).
//
// Saving: every rank writes its shard into the temporary directory and the ranks agree that
// all succeeded; rank 0 then writes config.yaml and the manifest and renames the directory to
// step_NNNNNN. A crash at any point leaves the previous checkpoints as they were.
//
// Loading (any layout, any precision): the manifest and every file's checksum are checked,
// the whole model's master weights and moments are put together from all shards, and each
// rank takes its part for its own layout and ZeRO ownership. The parameters are the master
// weights rounded to the run's precision, which is bitwise what the uninterrupted run holds:
// each update rounds the master weights into the parameters the same way.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"
#include "parallel/comm.h"
#include "parallel/grid.h"
#include "train/checkpoint_manifest.h"
#include "train/trainer.h"

namespace trident::train {

// Writes the checkpoint of `step` (updates done) into cfg.checkpoint.dir, removes step_*
// directories newer than it (left from a run this one resumed before, so never to be resumed)
// and the oldest beyond checkpoint.keep. Collective over `world`, the whole grid. Returns the
// directory. Throws trident::Error on every rank if any rank failed to write.
std::string save_checkpoint(const config::Config& cfg, Trainer& trainer, parallel::Grid& grid,
                            parallel::Comm& world, int step, int skipped_total);

// A checkpoint read whole: the manifest and the whole model's fp32 master weights and moments
// (buffers of model::ParamLayout(manifest.shape)).
struct FullCheckpoint {
    std::string path;
    Manifest manifest;
    std::vector<float> master, exp_avg, exp_avg_sq;
};

// Reads a checkpoint directory after checking its manifest and every file's size and
// SHA-256; without `moments`, the master weights only. Throws trident::Error naming the
// file at fault.
FullCheckpoint read_checkpoint(const std::string& dir, bool moments = true);

// `path` itself if it is a checkpoint directory (holds a manifest.json), else the newest
// step_* in it that reads without fault, each unusable newer one reported on stderr.
FullCheckpoint read_newest_checkpoint(const std::string& path, bool moments = true);

// Puts a checkpoint into the trainer of this rank: parameters, optimizer state and (fp16 to
// fp16) the loss scaler. The model's shape must be the config's; layout and precision may
// differ from the writer's.
void restore_checkpoint(const FullCheckpoint& ck, Trainer& trainer);

// The model of a checkpoint (or of the newest usable one in a checkpoint.dir) with its config:
// the fp32 master weights in the layout of the config's model.
struct LoadedModel {
    config::Config cfg;
    std::vector<float> params;  // host, model::ParamLayout(gpt_shape(cfg))
    std::string path;           // the checkpoint directory it came from
};
LoadedModel load_model_checkpoint(const std::string& path);

}  // namespace trident::train
