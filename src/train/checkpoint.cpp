// Training checkpoints: the collective save, the checked load and the resharding (see
// checkpoint.h).
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

#include "config/model_shape.h"
#include "io/fault_injection.h"
#include "io/output_file.h"
#include "io/safetensors.h"
#include "io/sha256.h"
#include "kernels/dtype.h"
#include "kernels/error.h"
#include "model/lora.h"
#include "parallel/agreement.h"
#include "parallel/watchdog.h"
#include "train/base_weights.h"

namespace trident::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kTempPrefix = ".tmp_";
constexpr const char* kKinds[3] = {"master", "exp_avg", "exp_avg_sq"};

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
    const optim::AdamW::State& state = share.state;
    const auto& owned = share.owned;
    const kernels::DType dtype = share.dtype;
    const parallel::Coordinates& c = share.coordinates;
    const int zero_stage = share.zero_stage;
    // 16-bit parameters as their bit patterns (the floats hold them exactly).
    std::vector<uint16_t> half(dtype == kernels::DType::f32 ? 0 : params.size());
    for (std::size_t i = 0; i < half.size(); ++i)
        half[i] = dtype == kernels::DType::bf16 ? kernels::to_bf16(params[i])
                                                : kernels::to_f16(params[i]);
    const std::vector<float>* moments[3] = {&state.master, &state.m, &state.v};

    std::vector<io::TensorToWrite> tensors;
    // The replicas of the weights are the data-context group's D·C ranks: the first writes
    // them, and (zero_stage 0) the optimizer state.
    const bool first_replica = c.dp == 0 && c.cp == 0;
    for (const model::ParamTensor& t : layout.tensors()) {
        if (layout.held_elsewhere(t)) continue;  // another rank writes it
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
            for (int k = 0; k < 3; ++k)
                tensors.push_back(
                    {std::string(kKinds[k]) + "/" + t.name + "/" + std::to_string(lo - t.offset),
                     {static_cast<int64_t>(hi - lo)},
                     moments[k]->data() + lo});
        }
    }
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

bool same_model(const model::GptShape& a, const model::GptShape& b) {
    return a.vocab == b.vocab && a.max_seq == b.max_seq && a.layers == b.layers &&
           a.hidden == b.hidden && a.heads == b.heads && a.ffn == b.ffn && a.arch == b.arch &&
           a.kv_heads == b.kv_heads && a.tied == b.tied;
}

// The adapters a manifest records (rank 0: none).
model::LoraShape lora_shape(const LoraRecord& record) {
    model::LoraShape lora;
    lora.rank = record.rank;
    for (const std::string& name : record.targets)
        for (int i = 0; i < model::kLoraTargets; ++i)
            if (name == model::lora_target_name(static_cast<model::LoraTarget>(i)))
                lora.targets[static_cast<std::size_t>(i)] = true;
    return lora;
}

std::string describe(const model::LoraShape& lora) {
    if (lora.rank == 0) return "the whole model";
    std::string targets;
    for (int i = 0; i < model::kLoraTargets; ++i)
        if (lora.targets[static_cast<std::size_t>(i)])
            targets += std::string(targets.empty() ? "" : ", ") +
                       model::lora_target_name(static_cast<model::LoraTarget>(i));
    return "low-rank adapters of rank " + std::to_string(lora.rank) + " on " + targets;
}

// What tensor rank `tp` of `tensor` on stage `plan` trained: its part of the model or, under
// low-rank adapters, of the adapters.
model::ParamLayout trained_layout(const model::GptShape& shape, const model::LoraShape& lora,
                                  int tp, int tensor, const model::StagePlan& plan) {
    if (lora.rank > 0) return model::ParamLayout::for_lora(shape, lora, tp, tensor, plan);
    return model::ParamLayout(shape, tp, tensor, plan);
}

std::string describe(const model::GptShape& s) {
    return std::string(s.arch == model::Arch::llama ? "llama" : "gpt2") + ", vocab " +
           std::to_string(s.vocab) + ", seq " + std::to_string(s.max_seq) + ", layers " +
           std::to_string(s.layers) + ", hidden " + std::to_string(s.hidden) + ", heads " +
           std::to_string(s.heads) + ", kv heads " + std::to_string(s.kv_heads) + ", ffn " +
           std::to_string(s.ffn) + (s.tied ? ", tied" : ", untied");
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
    m.shape = trainer.model().shape();
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
    for (std::size_t i = 0; i + keep < kept.size(); ++i) discard(kept[i]);
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
    share.state = trainer.optimizer().state();
    share.owned = trainer.data_parallel().owned_ranges();
    share.layout = &trainer.model().trainable_layout();
    share.dtype = trainer.model().precision().params;
    share.coordinates = grid.coordinates();
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

namespace {

// Where a rank needs values: a run of elements of one tensor, from `full` in whole-tensor
// coordinates, to `local` in the reader's flat buffer.
struct Need {
    std::size_t full, count, local;
};

// The runs of the reader's owned elements, tensor by tensor, sorted by `full`.
std::map<std::string, std::vector<Need>> needs_of(
    const model::ParamLayout& layout,
    const std::vector<std::pair<std::size_t, std::size_t>>& owned) {
    std::map<std::string, std::vector<Need>> needs;
    for (const model::ParamTensor& t : layout.tensors())
        for (const auto& [offset, count] : owned) {
            const std::size_t lo = std::max(t.offset, offset) - t.offset;
            const std::size_t hi = std::min(t.offset + t.numel, offset + count);
            if (t.offset + lo >= hi) continue;
            const std::size_t end = hi - t.offset;
            model::for_each_slice_run(
                t, layout.tensor_rank(), [&](std::size_t l, std::size_t f, std::size_t n) {
                    const std::size_t a = std::max(l, lo), b = std::min(l + n, end);
                    if (a < b) needs[t.name].push_back({f + a - l, b - a, t.offset + a});
                });
        }
    for (auto& [name, runs] : needs)
        std::sort(runs.begin(), runs.end(),
                  [](const Need& x, const Need& y) { return x.full < y.full; });
    return needs;
}

// Calls take(piece_offset, count, local) for each overlap of a piece (elements lo .. lo+n of
// the writer's slice `t` of tensor rank `tp`) with the sorted runs `needs`.
template <typename Take>
void overlaps(const model::ParamTensor& t, int tp, std::size_t lo, std::size_t n,
              const std::vector<Need>& needs, Take take) {
    model::for_each_slice_run(t, tp, [&](std::size_t l, std::size_t f, std::size_t count) {
        const std::size_t a = std::max(l, lo), b = std::min(l + count, lo + n);
        if (a >= b) return;
        const std::size_t full = f + a - l, full_end = f + b - l;
        // The first run that ends after `full`.
        auto it =
            std::upper_bound(needs.begin(), needs.end(), full,
                             [](std::size_t x, const Need& r) { return x < r.full + r.count; });
        for (; it != needs.end() && it->full < full_end; ++it) {
            const std::size_t from = std::max(full, it->full);
            const std::size_t to = std::min(full_end, it->full + it->count);
            take(a - lo + (from - full), to - from, it->local + (from - it->full));
        }
    });
}

// A piece's name: KIND/TENSOR/LO (checkpoint.h).
struct PieceName {
    int kind = -1;  // into kKinds; -1: not an optimizer piece (param/..., or malformed)
    std::string tensor;
    std::size_t lo = 0;
};
PieceName parse_piece(const std::string& name) {
    PieceName p;
    const std::size_t slash = name.find('/'), last = name.rfind('/');
    if (slash == std::string::npos || last <= slash) return p;
    const std::string kind = name.substr(0, slash);
    for (int k = 0; k < 3; ++k)
        if (kind == kKinds[k]) p.kind = k;
    p.tensor = name.substr(slash + 1, last - slash - 1);
    try {
        p.lo = std::stoull(name.substr(last + 1));
    } catch (const std::logic_error&) {
        p.kind = -1;
    }
    return p;
}

}  // namespace

CheckpointShare read_share(const std::string& dir, const model::ParamLayout& layout,
                           const std::vector<std::pair<std::size_t, std::size_t>>& owned,
                           bool moments) {
    CheckpointShare share;
    share.path = dir;
    share.manifest = read_manifest(dir);
    const Manifest& m = share.manifest;
    if (!same_model(m.shape, layout.shape()))
        throw Error(dir + ": holds another model (" + describe(m.shape) +
                    ") than the config asks for (" + describe(layout.shape()) + ")");
    const model::LoraShape lora = lora_shape(m.lora);
    if (lora.rank != layout.lora().rank || lora.targets != layout.lora().targets)
        throw Error(dir + ": trained " + describe(lora) + ", the config trains " +
                    describe(layout.lora()) + " (training.lora)");
    verify_sizes(dir, m);  // no reading

    const std::map<std::string, std::vector<Need>> needs = needs_of(layout, owned);
    std::vector<float>* targets[3] = {&share.master, &share.exp_avg, &share.exp_avg_sq};
    for (int k = 0; k < (moments ? 3 : 1); ++k) targets[k]->assign(layout.total(), 0.0f);
    std::vector<uint8_t> seen(layout.total() * 3, 0);  // per kind, per element of the buffer
    // The writer's whole tensors (its padded vocab).
    const model::ParamLayout whole = trained_layout(m.shape, lora, 0, 1, {});

    for (const ManifestFile& f : m.files) {
        if (f.pp < 0) continue;
        const std::string path = (fs::path(dir) / f.name).string();
        if (f.pp >= m.layout.pipeline || f.tp >= m.layout.tensor || f.dp >= m.layout.data ||
            f.cp >= m.layout.context)
            throw Error(path + ": grid coordinates outside the manifest's layout");
        const model::ParamLayout writer =
            trained_layout(m.shape, lora, f.tp, m.layout.tensor,
                           model::StagePlan{m.layout.pipeline, f.pp, m.layout.virtual_stages,
                                            m.layout.chunk_layers});
        // Opened only if the writer's slices hold anything this rank needs.
        bool wanted = false;
        for (const model::ParamTensor& t : writer.tensors()) {
            const auto it = needs.find(t.name);
            if (it != needs.end() && !writer.held_elsewhere(t))
                overlaps(t, f.tp, 0, t.numel, it->second,
                         [&](std::size_t, std::size_t, std::size_t) { wanted = true; });
        }
        if (!wanted) continue;

        const io::SafetensorsFile file = io::SafetensorsFile::open(path);
        // The pieces' digests are in the header, and the header's in the manifest; a
        // checkpoint written without them is checked whole.
        const bool pieces_checked = !f.header_sha256.empty();
        if (pieces_checked && file.header_sha256() != f.header_sha256)
            throw Error(path +
                        ": SHA-256 of the header does not match the manifest (the file "
                        "is corrupt)");
        if (!pieces_checked) {
            if (io::sha256_file(path) != f.sha256)
                throw Error(path + ": SHA-256 does not match the manifest (the file is corrupt)");
            share.tensor_bytes += f.bytes;
        }
        uint64_t pieces_read = 0;
        std::vector<char> raw;
        for (const io::TensorInfo& info : file.tensors()) {
            const PieceName piece = parse_piece(info.name);
            if (info.name.rfind("param/", 0) == 0) continue;
            const model::ParamTensor* t = piece.kind >= 0 ? writer.find(piece.tensor) : nullptr;
            if (!t || piece.lo + info.numel > t->numel || info.dtype != kernels::DType::f32)
                throw Error(path + ": tensor \"" + info.name +
                            "\" is not part of this rank's layout");
            if (piece.kind > 0 && !moments) continue;
            const auto need = needs.find(t->name);
            if (need == needs.end()) continue;
            std::vector<std::array<std::size_t, 3>> takes;  // piece offset, count, local
            overlaps(*t, f.tp, piece.lo, info.numel, need->second,
                     [&](std::size_t at, std::size_t n, std::size_t local) {
                         takes.push_back({at, n, local});
                     });
            if (takes.empty()) continue;
            raw.resize(info.data_end - info.data_begin);
            file.read_raw(info, raw);
            pieces_read += raw.size();
            if (pieces_checked) {
                const auto digest = file.metadata().find("sha256/" + info.name);
                if (digest == file.metadata().end())
                    throw Error(path + ": tensor \"" + info.name +
                                "\" has no SHA-256 in the header");
                if (io::sha256_hex(std::string_view(raw.data(), raw.size())) != digest->second)
                    throw Error(path + ": SHA-256 does not match for tensor \"" + info.name +
                                "\" (the file is corrupt)");
            }
            const float* values = reinterpret_cast<const float*>(raw.data());
            std::vector<float>& target = *targets[piece.kind];
            for (const auto& [at, n, local] : takes)
                for (std::size_t i = 0; i < n; ++i) {
                    target[local + i] = values[at + i];
                    if (seen[3 * (local + i) + static_cast<std::size_t>(piece.kind)]++)
                        throw Error(path + ": tensor \"" + info.name + "\" overlaps another shard");
                }
        }
        share.header_bytes += file.bytes_read() - pieces_read;
        share.tensor_bytes += pieces_read;
    }

    // Every element owned must have come from some shard, but for padded vocabulary rows
    // past the writer's (zero in every layout).
    for (const auto& [name, runs] : needs) {
        const std::size_t written = whole.find(name)->numel;
        for (const Need& r : runs)
            for (std::size_t i = 0; i < r.count && r.full + i < written; ++i)
                for (int k = 0; k < (moments ? 3 : 1); ++k)
                    if (!seen[3 * (r.local + i) + static_cast<std::size_t>(k)])
                        throw Error(dir + ": incomplete: no shard holds " + kKinds[k] + " of \"" +
                                    name + "\" element " + std::to_string(r.full + i));
    }
    return share;
}

void restore_checkpoint(const CheckpointShare& share, Trainer& trainer) {
    const Manifest& m = share.manifest;
    optim::AdamW::State state;
    state.step = m.adam_step;
    state.master = share.master;
    state.m = share.exp_avg;
    state.v = share.exp_avg_sq;
    trainer.restore_optimizer(state);  // collective
    trainer.guard().restore({m.skipped_in_a_row, m.recent_losses, m.recent_grad_norms});
    if (trainer.scaler().dynamic() && m.precision == kernels::name_of(kernels::DType::f16))
        trainer.scaler().restore(m.loss_scale, m.good_steps);
}

LoadedModel load_model_checkpoint(const std::string& path) {
    std::vector<std::string> candidates;
    if (fs::exists(fs::path(path) / kManifestName)) {
        candidates.push_back(path);
    } else {
        candidates = list_checkpoints(path);
        std::reverse(candidates.begin(), candidates.end());
        if (candidates.empty())
            throw Error(path +
                        ": no checkpoint here (expected manifest.json, or step_* "
                        "directories holding one)");
    }
    for (const std::string& dir : candidates) {
        try {
            LoadedModel loaded;
            loaded.path = dir;
            loaded.cfg = config::load((fs::path(dir) / "config.yaml").string());
            const model::ParamLayout whole(gpt_shape(loaded.cfg));
            const model::Lora adapters = lora_of(loaded.cfg);
            if (!adapters.shape.rank) {
                loaded.params = read_share(dir, whole, {{0, whole.total()}}, false).master;
                return loaded;
            }
            const model::ParamLayout whole_lora =
                model::ParamLayout::for_lora(whole.shape(), adapters.shape);
            CheckpointShare share = read_share(dir, whole_lora, {{0, whole_lora.total()}}, false);
            loaded.adapters = std::move(share.master);
            const LoraRecord& lora = share.manifest.lora;
            loaded.params.assign(whole.total(), 0.0f);
            const std::string base = load_base_weights(lora.base, whole, loaded.params.data());
            if (base_weights_sha256(base) != lora.base_sha256)
                throw Error(dir + ": the base weights " + base +
                            " are not those the adapters were trained on (their SHA-256 "
                            "differs from the manifest's)");
            model::merge_lora(whole, loaded.params.data(), whole_lora, loaded.adapters.data(),
                              adapters.scale);
            return loaded;
        } catch (const Error& e) {
            if (candidates.size() == 1) throw;
            std::fprintf(stderr, "checkpoint: skipping %s: %s\n", dir.c_str(), e.what());
        }
    }
    throw Error(path + ": none of its " + std::to_string(candidates.size()) +
                " checkpoints is usable");
}

}  // namespace trident::train
