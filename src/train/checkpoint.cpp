// Training checkpoints: the collective save (see checkpoint.h; the loading side is
// checkpoint_read.cpp).
#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "io/fault_injection.h"
#include "io/output_file.h"
#include "io/safetensors.h"
#include "io/sha256.h"
#include "kernels/dtype.h"
#include "kernels/error.h"
#include "parallel/agreement.h"
#include "parallel/watchdog.h"
#include "train/base_weights.h"

namespace trident::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kTempPrefix = ".tmp_";

// ppP_tpT_dpD, with _cpK after the tensor coordinate when the sequence is split.
std::string shard_name(const parallel::Coordinates& c, int context) {
    return "pp" + std::to_string(c.pp) + "_tp" + std::to_string(c.tp) +
           (context > 1 ? "_cp" + std::to_string(c.cp) : std::string()) + "_dp" +
           std::to_string(c.dp) + ".safetensors";
}

// Removes a checkpoint directory without ever leaving a partial step_* behind: renamed out of
// the way first (atomic), so a crash mid-removal leaves a .tmp_ directory the next save clears.
void discard(const fs::path& dir) {
    const fs::path doomed =
        dir.parent_path() / (kTempPrefix + std::string("discarded_") + dir.filename().string());
    fs::remove_all(doomed);
    fs::rename(dir, doomed);
    fs::remove_all(doomed);
}

// This rank's shard (see checkpoint.h) from its share in host memory, each tensor's SHA-256
// in its header.
io::WrittenFile write_shard(const std::string& path, const ShareSnapshot& share) {
    const model::ParamLayout& layout = *share.layout;
    const std::vector<float>& params = share.params;
    const optim::OptimizerState& state = share.state;
    const auto& owned = share.owned;
    const kernels::DType dtype = share.dtype;
    const parallel::Coordinates& c = share.coordinates;
    const int zero_stage = share.zero_stage;
    // 16-bit parameters as their bit patterns (the floats hold them exactly).
    std::vector<uint16_t> half(dtype == kernels::DType::f32 ? 0 : params.size());
    for (std::size_t i = 0; i < half.size(); ++i)
        half[i] = dtype == kernels::DType::bf16 ? kernels::to_bf16(params[i])
                                                : kernels::to_f16(params[i]);

    std::vector<io::TensorToWrite> tensors;
    // The replicas of the weights are the data-context group's D·C ranks: the first writes
    // them, and (zero_stage 0) the optimizer state; a split expert's are its expert-data
    // group's (model/param_layout.h): the first of those.
    for (const model::ParamTensor& t : layout.tensors()) {
        if (layout.held_elsewhere(t)) continue;  // another rank writes it
        const bool first_replica =
            layout.split_expert(t) ? share.expert_data_rank == 0 : c.dp == 0 && c.cp == 0;
        if (first_replica)
            tensors.push_back({"param/" + t.name, t.shape,
                               half.empty() ? static_cast<const void*>(params.data() + t.offset)
                                            : static_cast<const void*>(half.data() + t.offset),
                               dtype});
        if (zero_stage == 0 && !first_replica) continue;  // replica 0 writes the optimizer state
        for (const auto& [offset, count] : owned) {
            const std::size_t lo = std::max(t.offset, offset);
            const std::size_t hi = std::min(t.offset + t.numel, offset + count);
            if (lo >= hi) continue;
            for (std::size_t k = 0; k < state.names.size(); ++k)
                tensors.push_back(
                    {state.names[k] + "/" + t.name + "/" + std::to_string(lo - t.offset),
                     {static_cast<int64_t>(hi - lo)},
                     state.values[k].data() + lo});
        }
    }
    for (const auto& [name, values] : state.matrices)
        tensors.push_back({"MATRIX/" + name, {static_cast<int64_t>(values.size())}, values.data()});
    std::map<std::string, std::string> metadata{{"format", "trident-shard"}};
    for (const io::TensorToWrite& t : tensors) {
        std::size_t bytes = kernels::size_of(t.dtype);
        for (int64_t d : t.shape) bytes *= static_cast<std::size_t>(d);
        metadata["sha256/" + t.name] =
            io::sha256_hex(std::string_view(static_cast<const char*>(t.data), bytes));
    }
    return io::write_safetensors(path, tensors, metadata);
}

// The test fault TRIDENT_TEST_CRASH_IN_SAVE (io/fault_injection.h): the shard cut to half its
// size, the rank gone, as a rank lost in the middle of writing would leave them.
[[noreturn]] void die_mid_write(const fs::path& shard, int step, int rank) {
    fs::resize_file(shard, fs::file_size(shard) / 2);
    std::fprintf(stderr,
                 "checkpoint: TRIDENT_TEST_CRASH_IN_SAVE: rank %d killed mid-save of step %d\n",
                 rank, step);
    // Time for the launcher to forward the line before the process is gone.
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    std::raise(SIGKILL);
    std::abort();  // not reached: SIGKILL cannot be caught
}

// A file written whole and synced to the disk (it is renamed into place with its directory).
void write_synced(const std::string& path, const std::string& text) {
    io::OutputFile out(path);
    out.write(text);
    out.sync();
    out.close();
}

// Any rank's failure becomes a CheckpointError on every rank, with the first failing rank's
// message. The save's temporary directory is removed then (by rank 0, once every rank has
// stopped writing), giving back what a full disk let it write.
void agree(parallel::Comm& world, const std::string& error, const std::string& what,
           const fs::path& tmp) {
    const std::string failure = parallel::first_failure(world, error);
    if (failure.empty()) return;
    if (world.rank() == 0) {
        std::error_code ignored;
        fs::remove_all(tmp, ignored);
    }
    throw CheckpointError(what + " not saved: " + failure);
}

// The manifest of the save of `step`, but for its files.
Manifest manifest_of(const config::Config& cfg, Trainer& trainer, int step, int skipped_total,
                     const std::vector<DataFileRecord>& data, const LoraRecord& lora) {
    Manifest m;
    m.step = step;
    m.samples_consumed = static_cast<int64_t>(step) * cfg.training.global_batch;
    m.seed = cfg.training.seed;
    m.adam_step = trainer.optimizer().steps_taken();
    m.loss_scale = trainer.scaler().scale();
    m.good_steps = trainer.scaler().good_steps();
    m.skipped_total = skipped_total;
    const StepGuard::State guard = trainer.guard().state();
    m.skipped_in_a_row = guard.skipped_in_a_row;
    m.recent_losses = guard.losses;
    m.recent_grad_norms = guard.grad_norms;
    m.shape = trainer.model().layout().shape();
    const auto& p = cfg.parallel;
    m.layout = CheckpointLayout{p.pipeline,
                                p.tensor,
                                p.data,
                                p.virtual_stages,
                                pipeline::to_string(p.schedule),
                                p.zero_stage,
                                p.bucket_size,
                                cfg.derived.chunk_layers,
                                p.context,
                                config::to_string(p.context_mode)};
    m.precision = kernels::name_of(cfg.training.precision);
    m.data = data;
    m.data_recorded = true;
    m.lora = lora;
    return m;
}

// Rank 0, once every rank has written its shard: config.yaml, the manifest (last), the
// temporary directory renamed into place, and the step_* directories that give way.
void finish_directory(const PendingSave& save, const std::vector<ShardReport>& reports) {
    const fs::path root(save.root), tmp = root / (kTempPrefix + save.name),
                                    final_dir = root / save.name;
    Manifest m = save.manifest;
    // The adapters' base, relative to the checkpoint: runs that move together keep finding it.
    if (m.lora.rank > 0) m.lora.base = base_relative_to(m.lora.base, final_dir.string());
    write_synced((tmp / "config.yaml").string(), save.config_yaml);
    m.files.push_back({"config.yaml", -1, -1, -1, fs::file_size(tmp / "config.yaml"),
                       io::sha256_file((tmp / "config.yaml").string()), ""});
    for (std::size_t r = 0; r < reports.size(); ++r) {
        const parallel::Coordinates rc = parallel::coordinates_of(save.shape, static_cast<int>(r));
        const ShardReport& written = reports[r];
        m.files.push_back({shard_name(rc, save.shape.context), rc.pp, rc.tp, rc.dp, written.bytes,
                           std::string(written.sha256, sizeof(written.sha256)),
                           std::string(written.header_sha256, sizeof(written.header_sha256)),
                           rc.cp});
    }
    write_synced((tmp / kManifestName).string(), manifest_json(m));
    io::sync_path(tmp.string());
    // A step_ directory of this step (an unusable one the run resumed before) gives way.
    if (fs::exists(final_dir)) discard(final_dir);
    fs::rename(tmp, final_dir);
    io::sync_path(root.string());
    std::vector<std::string> kept;
    for (const std::string& dir : list_checkpoints(root.string()))
        if (fs::path(dir).filename().string() > save.name)
            discard(dir);  // abandoned
        else
            kept.push_back(dir);
    const std::size_t keep = static_cast<std::size_t>(save.keep);
    // The base of some run's adapters stays (base_weights.h).
    for (std::size_t i = 0; i + keep < kept.size(); ++i)
        if (pinned_by(kept[i]).empty()) discard(kept[i]);
}

}  // namespace

PendingSave begin_save(const config::Config& cfg, Trainer& trainer, parallel::Grid& grid,
                       parallel::Comm& world, int step, int skipped_total,
                       const std::vector<DataFileRecord>& data, const LoraRecord& lora) {
    PendingSave save;
    save.root = *cfg.checkpoint.dir;
    save.name = checkpoint_name(step);
    save.keep = cfg.checkpoint.keep;
    const fs::path root(save.root), tmp = root / (kTempPrefix + save.name);
    const std::string what = "checkpoint " + (root / save.name).string();
    parallel::set_step(step);
    const parallel::ScopedPhase phase(parallel::Phase::checkpoint);

    // Rank 0 clears what interrupted saves left and makes the temporary directory.
    std::string error;
    if (world.rank() == 0) {
        try {
            fs::create_directories(root);
            for (const auto& entry : fs::directory_iterator(root))
                if (entry.path().filename().string().rfind(kTempPrefix, 0) == 0)
                    fs::remove_all(entry.path());
            fs::create_directories(tmp);
            save.manifest = manifest_of(cfg, trainer, step, skipped_total, data, lora);
            save.config_yaml = config::to_yaml(cfg);
        } catch (const std::exception& e) {
            error = e.what();
        }
    }
    agree(world, error, what, tmp);

    // This rank's share in host memory; collective over the data group (ZeRO-3 puts the
    // parameters together from the replicas' shards).
    ShareSnapshot& share = save.share;
    share.params = trainer.local_params();
    try {
        share.state = trainer.optimizer_state();  // collective where the state is in files
    } catch (const TrainingStopped&) {
        if (world.rank() == 0) {
            std::error_code ignored;
            fs::remove_all(tmp, ignored);
        }
        throw;
    }
    // With hybrid sharding each shard group holds the whole state: the first one writes it.
    if (grid.data_replica().rank() == 0)
        share.owned = trainer.data_parallel().owned_ranges();
    else
        share.state.matrices.clear();
    share.layout = &trainer.model().trainable().layout();
    share.dtype = trainer.model().options().precision.params;
    share.coordinates = grid.coordinates();
    share.expert_data_rank = grid.group(parallel::Group::expert_data).rank();
    share.zero_stage = cfg.parallel.zero_stage;
    save.shape = grid.shape();
    save.step = step;
    save.rank = world.rank();
    return save;
}

void write_share(PendingSave& save) {
    const fs::path shard = fs::path(save.root) / (kTempPrefix + save.name) /
                           shard_name(save.share.coordinates, save.shape.context);
    try {
        const io::WrittenFile written = write_shard(shard.string(), save.share);
        if (io::fault::crash_in_save(save.step, save.rank))
            die_mid_write(shard, save.step, save.rank);
        std::copy(written.sha256.begin(), written.sha256.end(), save.report.sha256);
        std::copy(written.header_sha256.begin(), written.header_sha256.end(),
                  save.report.header_sha256);
        save.report.bytes = written.bytes;
    } catch (const std::exception& e) {
        save.error = e.what();
    }
    save.share = {};  // the host copy is no longer needed
}

std::string commit_save(PendingSave& save, parallel::Comm& world) {
    const fs::path root(save.root), tmp = root / (kTempPrefix + save.name),
                                    final_dir = root / save.name;
    const std::string what = "checkpoint " + final_dir.string();
    const parallel::ScopedPhase phase(parallel::Phase::checkpoint);
    agree(world, save.error, what, tmp);
    // Every rank's digest and size to everyone (rank 0 writes them down).
    std::vector<ShardReport> reports(static_cast<std::size_t>(world.size()));
    world.all_gather(kernels::ConstPtr(&save.report, kernels::DType::u8),
                     kernels::Ptr(reports.data(), kernels::DType::u8), sizeof(ShardReport));
    std::string error;
    if (world.rank() == 0) {
        try {
            finish_directory(save, reports);
        } catch (const std::exception& e) {
            error = e.what();
        }
    }
    agree(world, error, what, tmp);
    return final_dir.string();
}

std::string save_checkpoint(const config::Config& cfg, Trainer& trainer, parallel::Grid& grid,
                            parallel::Comm& world, int step, int skipped_total,
                            const std::vector<DataFileRecord>& data, const LoraRecord& lora) {
    PendingSave save = begin_save(cfg, trainer, grid, world, step, skipped_total, data, lora);
    write_share(save);
    return commit_save(save, world);
}

}  // namespace trident::train
