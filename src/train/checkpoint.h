// Training checkpoints: every rank's shard of the model and of the optimizer, written together,
// checked on load, and loadable into any P×M×C×D layout of the same model.
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
//     .lock                         the running job's lock on the directory, its host and pid
//                                   (train/directory_lock.h)
//
// A shard holds, under the whole model's tensor names (model/param_layout.h):
//   param/NAME                      the rank's slice of the tensor as the model holds it
//                                   (F32, BF16 or F16), from data-parallel rank 0
//   KIND/NAME/LO                    fp32 state of elements LO.. of that slice (the part of it
//                                   the rank owns under ZeRO-1), one piece per kind: master
//                                   (the master weights), then each state the optimizer keeps,
//                                   by its name (optim/optimizer.h; AdamW's exp_avg and
//                                   exp_avg_sq), which the reader takes by name too
//   MATRIX/KIND/NAME                fp32 state an optimizer keeps per whole matrix (GaLore's
//                                   exp_avg, exp_avg_sq, projector; optim/matrix_exchange.h),
//                                   whole, written by the rank that steps the matrix (of the
//                                   first shard group under hybrid sharding), read by name
//                                   by the one that steps it in the reader's layout
// Tensors several ranks hold are written by one: replicated ones (LayerNorms, row-parallel
// biases, wpe) by tensor rank 0, the tied wte by the first stage, and with zero_stage 0 (every
// replica holds the whole optimizer state) the optimizer state by data-parallel rank 0. So each
// element of the model is written exactly once, and where it lies in the whole tensor follows
// from the writer's tensor rank and the tensor's split (model::for_each_slice_run).
//
// Saving: every rank writes its shard into the temporary directory and the ranks agree that
// all succeeded; rank 0 then writes config.yaml and the manifest and renames the directory to
// step_NNNNNN. A crash at any point leaves the previous checkpoints as they were; a write that
// fails (a full disk) fails the save on every rank together (CheckpointError) and the
// temporary directory is removed.
//
// Every shard's header records the SHA-256 of each of its tensors (metadata key
// "sha256/NAME"), and the manifest the SHA-256 of each shard's header, so a reader can check
// the pieces it reads without reading the rest.
//
// Loading (any layout, any precision): each rank reads, for its own layout and ZeRO
// ownership, the master weights and the optimizer's state of what it owns, from the pieces of
// whichever shards hold them (read_share); the parameters are those master weights rounded to the
// run's precision and all-gathered over the data-parallel group, which is bitwise what the
// uninterrupted run holds: each update rounds the master weights into the parameters the
// same way.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "parallel/comm.h"
#include "parallel/grid.h"
#include "train/checkpoint_manifest.h"
#include "train/trainer.h"

namespace trident::train {

// A save that failed on some rank, thrown on every rank alike with the first failing rank's
// message (the file and the errno): what was written of it is gone, the checkpoints before it
// are as they were.
class CheckpointError : public Error {
public:
    using Error::Error;
};

// Writes the checkpoint of `step` (updates done) into cfg.checkpoint.dir, removes step_*
// directories newer than it (left from a run this one resumed before, so never to be resumed)
// and the oldest beyond checkpoint.keep. Collective over `world`, the whole grid; rank 0's
// `data` (the run's data files) and `lora` (the adapters trained, and the base weights under
// them; rank 0: none) go into the manifest. Returns the directory. Throws
// CheckpointError on every rank if any rank failed to write.
std::string save_checkpoint(const config::Config& cfg, Trainer& trainer, parallel::Grid& grid,
                            parallel::Comm& world, int step, int skipped_total,
                            const std::vector<DataFileRecord>& data = {},
                            const LoraRecord& lora = {});

// A save in three parts, which save_checkpoint runs one after another and an asynchronous
// save (train/async_checkpoint.h) spreads over the steps that follow: begin_save (collective:
// the temporary directory made, this rank's share copied to host memory), write_share (this
// rank's shard written from that copy, on any thread, with no communication), commit_save
// (collective: every rank's outcome agreed, then rank 0 writes config.yaml and the manifest
// and renames the directory). Until the commit, the save is only a .tmp_ directory.

// This rank's share in host memory: what its shard is written from.
struct ShareSnapshot {
    std::vector<float> params;    // as the layout lays them out (Trainer::local_params)
    optim::OptimizerState state;  // fp32 master weights and the optimizer's (Updater::state)
    std::vector<std::pair<std::size_t, std::size_t>> owned;  // DataParallel::owned_ranges
    const model::ParamLayout* layout = nullptr;              // the trainer's trainable layout
    kernels::DType dtype = kernels::DType::f32;              // the parameters'
    parallel::Coordinates coordinates;
    int expert_data_rank = 0;  // its place in the expert-data group (split experts' writers: 0)
    int zero_stage = 1;
};

// What each rank tells every other after writing its shard, gathered as bytes (every rank
// runs the same binary, so the layout is one).
struct ShardReport {
    uint64_t bytes = 0;           // the shard's size
    char sha256[64] = {};         // the shard's digest in hex
    char header_sha256[64] = {};  // its header's
};

struct PendingSave {
    std::string root, name;  // checkpoint.dir, step_NNNNNN
    int step = 0, rank = 0, keep = 1;
    parallel::GridShape shape;
    ShareSnapshot share;      // emptied once written
    Manifest manifest;        // rank 0: all but the files
    std::string config_yaml;  // rank 0
    ShardReport report;       // once written
    std::string error;        // this rank's failure to write, if any
};

// Throws CheckpointError on every rank if any rank failed to make the directory.
PendingSave begin_save(const config::Config& cfg, Trainer& trainer, parallel::Grid& grid,
                       parallel::Comm& world, int step, int skipped_total,
                       const std::vector<DataFileRecord>& data = {}, const LoraRecord& lora = {});
// Plants the test fault TRIDENT_TEST_CRASH_IN_SAVE. A failure is kept in `save.error`.
void write_share(PendingSave& save);
// Returns the directory; throws CheckpointError on every rank if any rank failed.
std::string commit_save(PendingSave& save, parallel::Comm& world);

// What one rank reads of a checkpoint: the fp32 master weights and (with `state`) every state
// the optimizer that wrote it kept, by name, of the ranges of its own flat buffer that it owns,
// never the whole model.
struct CheckpointShare {
    std::string path;
    Manifest manifest;
    // Buffers of the reader's layout, filled on the owned ranges (zero elsewhere); `state` is
    // empty without it.
    std::vector<float> master;
    std::map<std::string, std::vector<float>> state;
    // The per-matrix state asked for, whole, by "KIND/NAME" (OptimizerState::matrices).
    std::map<std::string, std::vector<float>> matrices;
    uint64_t header_bytes = 0;  // read: the headers of the shards that hold any of it
    uint64_t tensor_bytes = 0;  // read: the tensor pieces that hold any of it
};

// Reads the part of the checkpoint in `dir` that a rank with `layout` owns: `owned` are
// (offset, count) ranges of its flat buffer (the optimizer's ZeRO ownership). Only shards
// that hold some of it are opened, and of them only the header and the pieces overlapping
// it are read: a rank of a same-layout resume reads about 1/ranks of the checkpoint. What it
// reads is checked first (file sizes and header digests against the manifest, each piece's
// SHA-256 against its shard's header; a checkpoint written without them is checked whole).
// Throws trident::Error naming the file at fault; the model must be the layout's. `matrices`:
// the per-matrix state to read, whole, and its elements ("KIND/NAME": Updater::matrix_states).
CheckpointShare read_share(const std::string& dir, const model::ParamLayout& layout,
                           const std::vector<std::pair<std::size_t, std::size_t>>& owned,
                           bool state = true,
                           const std::map<std::string, std::size_t>& matrices = {});

// The parts of the shard `f` of the checkpoint in `dir` that fail their SHA-256: {"header"}
// (against the manifest), else the names of the tensors whose bytes differ from their digests
// in the header; none when all match. A resume checks the parts it reads alike; its
// parameters come from the master weights, so the param/ tensors are never among them.
std::vector<std::string> damaged_parts(const std::string& dir, const ManifestFile& f);

// Puts a share into the trainer of this rank: the optimizer's state of what it owns, the
// parameters as those master weights rounded and gathered over the data-parallel group (as
// after an update: bitwise what the uninterrupted run holds), and (fp16 to fp16) the loss
// scaler. Collective over the data group; layout and precision may differ from the writer's.
void restore_checkpoint(const CheckpointShare& share, Trainer& trainer);

// The model of a checkpoint (or of the newest usable one in a checkpoint.dir, each unusable
// newer one reported on stderr) with its config: the fp32 master weights in the layout of
// the config's model. A checkpoint of low-rank adapters gives its adapters too, and as the
// model its base weights (read again from where the manifest says, and checked against their
// SHA-256) with the adapters merged in.
struct LoadedModel {
    config::Config cfg;
    std::vector<float> params;  // host, model::ParamLayout(gpt_shape(cfg))
    std::string path;           // the checkpoint directory it came from
    // Host, model::ParamLayout::for_lora(gpt_shape(cfg), lora_of(cfg).shape); empty
    // without adapters.
    std::vector<float> adapters;
    std::string base;  // the base weights under them (a file or a checkpoint), as read
};
LoadedModel load_model_checkpoint(const std::string& path);

}  // namespace trident::train
