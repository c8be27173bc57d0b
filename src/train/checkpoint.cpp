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
#include <thread>

#include "error.h"
#include "io/safetensors.h"
#include "io/sha256.h"
#include "kernels/dtype.h"
#include "train/model_shape.h"

namespace trident::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kTempPrefix = ".tmp_";
constexpr const char* kKinds[3] = {"master", "exp_avg", "exp_avg_sq"};

std::string shard_name(const parallel::Coordinates& c) {
    return "pp" + std::to_string(c.pp) + "_tp" + std::to_string(c.tp) + "_dp" +
           std::to_string(c.dp) + ".safetensors";
}

io::Dtype io_dtype(kernels::DType t) {
    switch (t) {
        case kernels::DType::bf16:
            return io::Dtype::BF16;
        case kernels::DType::f16:
            return io::Dtype::F16;
        case kernels::DType::f32:
            break;
    }
    return io::Dtype::F32;
}

// Flushes a file (or directory) that is already written to the disk.
void sync_path(const fs::path& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::fsync(fd) != 0) {
        if (fd >= 0) ::close(fd);
        throw Error(path.string() + ": cannot sync to disk");
    }
    ::close(fd);
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

// This rank's shard (see checkpoint.h).
void write_shard(const std::string& path, Trainer& trainer, const parallel::Coordinates& c,
                 int zero_stage) {
    model::Gpt& gpt = trainer.model();
    const model::ParamLayout& layout = gpt.layout();
    const optim::AdamW::State state = trainer.optimizer().state(gpt.params());
    const auto owned = trainer.optimizer().owned_ranges();
    const std::vector<float> params = gpt.params_to_host();
    const kernels::DType dtype = gpt.precision().params;
    // 16-bit parameters as their bit patterns (the floats hold them exactly).
    std::vector<uint16_t> half(dtype == kernels::DType::f32 ? 0 : params.size());
    for (std::size_t i = 0; i < half.size(); ++i)
        half[i] = dtype == kernels::DType::bf16 ? kernels::to_bf16(params[i])
                                                : kernels::to_f16(params[i]);
    const std::vector<float>* moments[3] = {&state.master, &state.m, &state.v};

    std::vector<io::TensorToWrite> tensors;
    for (const model::ParamTensor& t : layout.tensors()) {
        if (layout.held_elsewhere(t)) continue;  // another rank writes it
        if (c.dp == 0)
            tensors.push_back({"param/" + t.name, t.shape,
                               half.empty() ? static_cast<const void*>(params.data() + t.offset)
                                            : static_cast<const void*>(half.data() + t.offset),
                               io_dtype(dtype)});
        if (zero_stage == 0 && c.dp != 0) continue;  // replica 0 writes the optimizer state
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
    io::write_safetensors(path, tensors, {{"format", "trident-shard"}});
}

// A fault for the tests of interrupted saves: TRIDENT_TEST_CRASH_IN_SAVE=STEP:RANK makes world
// rank RANK, in the save of step STEP, cut its written shard to half its size and die by
// SIGKILL, as a rank lost in the middle of writing would. Read once; unset, as in every real
// run, it does nothing.
struct CrashInSave {
    int step = -1;
    int rank = -1;
};

const CrashInSave& crash_in_save() {
    static const CrashInSave crash = [] {
        const char* text = std::getenv("TRIDENT_TEST_CRASH_IN_SAVE");
        CrashInSave c;
        char end = 0;
        if (text &&
            (std::sscanf(text, "%d:%d%c", &c.step, &c.rank, &end) != 2 || c.step < 1 || c.rank < 0))
            throw Error("TRIDENT_TEST_CRASH_IN_SAVE: expected STEP:RANK (e.g. 6:1), got '" +
                        std::string(text) + "'");
        return c;
    }();
    return crash;
}

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

// A digest and a size as floats that travel exactly (bytes, and the size in 16-bit pieces),
// behind a failure flag: what each rank reports to rank 0 after writing its shard.
constexpr std::size_t kReportSize = 1 + 32 + 4;

void pack_report(bool failed, const std::string& hex, uint64_t bytes, float* out) {
    out[0] = failed ? 1.0f : 0.0f;
    for (std::size_t i = 0; i < 32; ++i)
        out[1 + i] =
            failed ? 0.0f : static_cast<float>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
    for (std::size_t i = 0; i < 4; ++i)
        out[33 + i] = static_cast<float>((bytes >> (16 * i)) & 0xFFFF);
}

void unpack_report(const float* in, ManifestFile& f) {
    static const char* digits = "0123456789abcdef";
    f.sha256.clear();
    for (std::size_t i = 0; i < 32; ++i) {
        const int byte = static_cast<int>(in[1 + i]);
        f.sha256 += digits[byte >> 4];
        f.sha256 += digits[byte & 15];
    }
    f.bytes = 0;
    for (std::size_t i = 0; i < 4; ++i) f.bytes |= static_cast<uint64_t>(in[33 + i]) << (16 * i);
}

// Any rank's failure becomes an error on every rank (this rank's own message where it has one).
void agree(parallel::Comm& world, const std::string& error, const std::string& what) {
    float failed = error.empty() ? 0.0f : 1.0f;
    world.all_reduce(&failed, 1, parallel::ReduceOp::max);
    if (failed != 0.0f)
        throw Error(error.empty() ? what + ": another rank failed" : what + ": " + error);
}

// `full` (a buffer of `from`) in the layout `to` of the same model: tensor by tensor, wte's
// rows up to the smaller padded vocabulary (the padding rows are zero in both).
std::vector<float> relayout(const model::ParamLayout& from, const std::vector<float>& full,
                            const model::ParamLayout& to) {
    std::vector<float> out(to.total(), 0.0f);
    for (const model::ParamTensor& t : to.tensors()) {
        const model::ParamTensor* s = from.find(t.name);
        std::copy_n(full.begin() + static_cast<std::ptrdiff_t>(s->offset),
                    std::min(s->numel, t.numel),
                    out.begin() + static_cast<std::ptrdiff_t>(t.offset));
    }
    return out;
}

bool same_model(const model::GptShape& a, const model::GptShape& b) {
    return a.vocab == b.vocab && a.max_seq == b.max_seq && a.layers == b.layers &&
           a.hidden == b.hidden && a.heads == b.heads && a.ffn == b.ffn;
}

std::string describe(const model::GptShape& s) {
    return "vocab " + std::to_string(s.vocab) + ", seq " + std::to_string(s.max_seq) + ", layers " +
           std::to_string(s.layers) + ", hidden " + std::to_string(s.hidden) + ", heads " +
           std::to_string(s.heads) + ", ffn " + std::to_string(s.ffn);
}

}  // namespace

std::string save_checkpoint(const config::Config& cfg, Trainer& trainer, parallel::Grid& grid,
                            parallel::Comm& world, int step, int skipped_total) {
    const fs::path root(*cfg.checkpoint.dir);
    const std::string name = checkpoint_name(step);
    const fs::path tmp = root / (kTempPrefix + name), final_dir = root / name;
    const std::string what = "checkpoint " + final_dir.string();
    const bool leader = world.rank() == 0;

    // Rank 0 clears what interrupted saves left and makes the temporary directory.
    std::string error;
    if (leader) {
        try {
            fs::create_directories(root);
            for (const auto& entry : fs::directory_iterator(root))
                if (entry.path().filename().string().rfind(kTempPrefix, 0) == 0)
                    fs::remove_all(entry.path());
            fs::create_directories(tmp);
        } catch (const std::exception& e) {
            error = e.what();
        }
    }
    agree(world, error, what);

    // Every rank its shard, then its digest and size to everyone (rank 0 writes them down).
    const parallel::Coordinates& c = grid.coordinates();
    const fs::path shard = tmp / shard_name(c);
    std::string hex;
    uint64_t bytes = 0;
    try {
        const CrashInSave& crash = crash_in_save();
        write_shard(shard.string(), trainer, c, cfg.parallel.zero_stage);
        if (crash.step == step && crash.rank == world.rank())
            die_mid_write(shard, step, world.rank());
        hex = io::sha256_file(shard.string());
        bytes = fs::file_size(shard);
    } catch (const std::exception& e) {
        error = e.what();
    }
    float report[kReportSize];
    pack_report(!error.empty(), hex, bytes, report);
    std::vector<float> reports(kReportSize * static_cast<std::size_t>(world.size()));
    world.all_gather(report, reports.data(), kReportSize);
    bool any_failed = false;
    for (int r = 0; r < world.size(); ++r)
        any_failed |= reports[kReportSize * static_cast<std::size_t>(r)] != 0.0f;
    if (any_failed)
        throw Error(error.empty() ? what + ": another rank failed to write its shard"
                                  : what + ": " + error);

    if (leader) {
        try {
            Manifest m;
            m.step = step;
            m.samples_consumed = static_cast<int64_t>(step) * cfg.training.global_batch;
            m.seed = cfg.training.seed;
            m.adam_step = trainer.optimizer().steps_taken();
            m.loss_scale = trainer.scaler().scale();
            m.good_steps = trainer.scaler().good_steps();
            m.skipped_total = skipped_total;
            m.shape = trainer.model().shape();
            const auto& p = cfg.parallel;
            m.layout = CheckpointLayout{
                p.pipeline,   p.tensor,     p.data, p.virtual_stages, config::to_string(p.schedule),
                p.zero_stage, p.bucket_size};
            m.precision = config::to_string(cfg.training.precision);
            {
                std::ofstream out(tmp / "config.yaml");
                out << config::to_yaml(cfg);
                if (!out.flush()) throw Error((tmp / "config.yaml").string() + ": cannot write");
            }
            sync_path(tmp / "config.yaml");
            m.files.push_back({"config.yaml", -1, -1, -1, fs::file_size(tmp / "config.yaml"),
                               io::sha256_file((tmp / "config.yaml").string())});
            for (int r = 0; r < world.size(); ++r) {
                const parallel::Coordinates rc = parallel::coordinates_of(grid.shape(), r);
                ManifestFile f{shard_name(rc), rc.pp, rc.tp, rc.dp, 0, ""};
                unpack_report(reports.data() + kReportSize * static_cast<std::size_t>(r), f);
                m.files.push_back(f);
            }
            {
                std::ofstream out(tmp / kManifestName);
                out << manifest_json(m);
                if (!out.flush()) throw Error((tmp / kManifestName).string() + ": cannot write");
            }
            sync_path(tmp / kManifestName);
            sync_path(tmp);
            // A step_ directory of this step (an unusable one the run resumed before) gives way.
            if (fs::exists(final_dir)) discard(final_dir);
            fs::rename(tmp, final_dir);
            sync_path(root);
            const auto all = list_checkpoints(root.string());
            std::vector<std::string> kept;
            for (const std::string& dir : all)
                if (fs::path(dir).filename().string() > name)
                    discard(dir);  // abandoned
                else
                    kept.push_back(dir);
            const std::size_t keep = static_cast<std::size_t>(cfg.checkpoint.keep);
            for (std::size_t i = 0; i + keep < kept.size(); ++i) discard(kept[i]);
        } catch (const std::exception& e) {
            error = e.what();
        }
    }
    agree(world, error, what);
    return final_dir.string();
}

FullCheckpoint read_checkpoint(const std::string& dir, bool moments) {
    FullCheckpoint ck;
    ck.path = dir;
    ck.manifest = read_manifest(dir);
    verify_files(dir, ck.manifest);
    const Manifest& m = ck.manifest;
    const model::ParamLayout full(m.shape);
    ck.master.assign(full.total(), 0.0f);
    if (moments) {
        ck.exp_avg.assign(full.total(), 0.0f);
        ck.exp_avg_sq.assign(full.total(), 0.0f);
    }
    std::vector<float>* targets[3] = {&ck.master, &ck.exp_avg, &ck.exp_avg_sq};
    std::vector<uint8_t> seen(full.total(), 0);
    for (const ManifestFile& f : m.files) {
        if (f.pp < 0) continue;
        const std::string path = (fs::path(dir) / f.name).string();
        if (f.pp >= m.layout.pipeline || f.tp >= m.layout.tensor || f.dp >= m.layout.data)
            throw Error(path + ": grid coordinates outside the manifest's layout");
        const model::ParamLayout writer(
            m.shape, f.tp, m.layout.tensor,
            model::StagePlan{m.layout.pipeline, f.pp, m.layout.virtual_stages});
        const io::SafetensorsFile file = io::SafetensorsFile::open(path);
        for (const io::TensorInfo& info : file.tensors()) {
            const std::size_t slash = info.name.find('/'), last = info.name.rfind('/');
            const std::string kind = info.name.substr(0, slash);
            if (kind == "param") continue;
            const int k = kind == kKinds[0]   ? 0
                          : kind == kKinds[1] ? 1
                          : kind == kKinds[2] ? 2
                                              : -1;
            const model::ParamTensor* t =
                last > slash ? writer.find(info.name.substr(slash + 1, last - slash - 1)) : nullptr;
            std::size_t lo = 0;
            try {
                lo = std::stoull(info.name.substr(last + 1));
            } catch (const std::logic_error&) {
                t = nullptr;
            }
            if (k < 0 || !t || lo + info.numel > t->numel)
                throw Error(path + ": tensor \"" + info.name +
                            "\" is not part of this rank's layout");
            if (k > 0 && !moments) continue;
            const std::vector<float> values = file.read_f32(info.name);
            const std::size_t base = full.find(t->name)->offset;
            std::vector<float>& target = *targets[k];
            for (std::size_t i = 0; i < values.size(); ++i) {
                const std::size_t at = base + model::full_element(*t, f.tp, lo + i);
                target[at] = values[i];
                if (k == 0 && seen[at]++)
                    throw Error(path + ": tensor \"" + info.name + "\" overlaps another shard");
            }
        }
    }
    const auto missing = std::count(seen.begin(), seen.end(), uint8_t{0});
    if (missing > 0)
        throw Error(dir + ": incomplete: the shards lack " + std::to_string(missing) + " of the " +
                    std::to_string(seen.size()) + " master weights");
    return ck;
}

FullCheckpoint read_newest_checkpoint(const std::string& path, bool moments) {
    if (fs::exists(fs::path(path) / kManifestName)) return read_checkpoint(path, moments);
    const auto all = list_checkpoints(path);
    if (all.empty())
        throw Error(path +
                    ": no checkpoint here (expected manifest.json, or step_* directories "
                    "holding one)");
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
        try {
            return read_checkpoint(*it, moments);
        } catch (const Error& e) {
            std::fprintf(stderr, "checkpoint: skipping %s: %s\n", it->c_str(), e.what());
        }
    }
    throw Error(path + ": none of its " + std::to_string(all.size()) + " checkpoints is usable");
}

void restore_checkpoint(const FullCheckpoint& ck, Trainer& trainer) {
    const Manifest& m = ck.manifest;
    model::Gpt& gpt = trainer.model();
    if (!same_model(m.shape, gpt.shape()))
        throw Error(ck.path + ": holds another model (" + describe(m.shape) +
                    ") than the config asks for (" + describe(gpt.shape()) + ")");
    const model::ParamLayout from(m.shape), whole(gpt.shape());
    const std::vector<float> master = relayout(from, ck.master, whole);
    gpt.load_full_params(master);  // the parameters: the master weights, rounded

    optim::AdamW::State state;
    state.step = m.adam_step;
    const std::vector<float>* sources[3] = {&master, &ck.exp_avg, &ck.exp_avg_sq};
    std::vector<float>* parts[3] = {&state.master, &state.m, &state.v};
    for (int k = 0; k < 3; ++k) {
        const std::vector<float> full = k == 0 ? master : relayout(from, *sources[k], whole);
        parts[k]->assign(gpt.buffer_size(), 0.0f);
        model::shard_params(whole, full.data(), gpt.layout(), parts[k]->data());
    }
    trainer.optimizer().restore(state);
    if (trainer.scaler().dynamic() && m.precision == config::to_string(config::Precision::fp16))
        trainer.scaler().restore(m.loss_scale, m.good_steps);
}

LoadedModel load_model_checkpoint(const std::string& path) {
    const FullCheckpoint ck = read_newest_checkpoint(path, false);
    LoadedModel loaded;
    loaded.path = ck.path;
    loaded.cfg = config::load((fs::path(ck.path) / "config.yaml").string());
    const model::ParamLayout whole(gpt_shape(loaded.cfg));
    if (!same_model(ck.manifest.shape, whole.shape()))
        throw Error(ck.path + ": config.yaml and manifest.json describe different models");
    loaded.params = relayout(model::ParamLayout(ck.manifest.shape), ck.master, whole);
    return loaded;
}

}  // namespace trident::train
