// Training checkpoints: the checked load, resharded into the reader's layout (see
// checkpoint.h; the saving side is checkpoint.cpp).
#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <map>

#include "config/model_shape.h"
#include "io/safetensors.h"
#include "io/sha256.h"
#include "kernels/dtype.h"
#include "kernels/error.h"
#include "model/lora.h"
#include "model/nf4_base.h"
#include "optim/optimizer.h"
#include "train/base_weights.h"
#include "train/checkpoint.h"

namespace trident::train {

namespace fs = std::filesystem;

namespace {

// The same experts' tensors (model.moe's routing may differ).
bool same_experts(const model::MoeSettings& a, const model::MoeSettings& b) {
    return a.experts == b.experts && a.ffn_hidden == b.ffn_hidden &&
           a.shared_experts == b.shared_experts && a.router == b.router;
}

// The same sizes, and the same kinds of part (model/model_spec.h).
bool same_model(const model::GptShape& a, const model::GptShape& b) {
    return a.vocab == b.vocab && a.max_seq == b.max_seq && a.layers == b.layers &&
           a.hidden == b.hidden && a.heads == b.heads && a.ffn == b.ffn &&
           a.kv_heads == b.kv_heads && a.head_size() == b.head_size() && a.tied == b.tied &&
           same_experts(a.moe, b.moe) && model::resolve_spec(a).same_parts(model::resolve_spec(b));
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
    return std::string(config::to_string(s.arch)) + ", vocab " + std::to_string(s.vocab) +
           ", seq " + std::to_string(s.max_seq) + ", layers " + std::to_string(s.layers) +
           ", hidden " + std::to_string(s.hidden) + ", heads " + std::to_string(s.heads) +
           ", kv heads " + std::to_string(s.kv_heads) + ", ffn " + std::to_string(s.ffn) +
           ", mlp " + model::mlp_kind(s) + (s.tied ? ", tied" : ", untied") +
           (s.head_dim > 0 ? ", heads of " + std::to_string(s.head_dim) : "") +
           (s.qk_norm ? ", qk_norm" : "") +
           (s.moe.enabled() ? ", " + std::to_string(s.moe.experts) + " experts of ffn " +
                                  std::to_string(s.moe.ffn_hidden) + " (" +
                                  std::to_string(s.moe.shared_experts) + " shared)"
                            : "");
}

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

// A piece's name: KIND/TENSOR/LO (checkpoint.h), KIND the state's name.
struct PieceName {
    std::string kind;  // empty: not a piece of state (malformed)
    std::string tensor;
    std::size_t lo = 0;
};
PieceName parse_piece(const std::string& name) {
    PieceName p;
    const std::size_t slash = name.find('/'), last = name.rfind('/');
    if (slash == std::string::npos || last <= slash) return p;
    p.tensor = name.substr(slash + 1, last - slash - 1);
    try {
        p.lo = std::stoull(name.substr(last + 1));
        p.kind = name.substr(0, slash);
    } catch (const std::logic_error&) {
        p.kind.clear();
    }
    return p;
}

// What a rank gathers from the shards it reads: the elements of its owned ranges, by kind of
// state (the master weights, and each state the writer's optimizer keeps, by its name), and
// which of them have arrived.
struct Gathering {
    std::map<std::string, std::vector<Need>> needs;
    bool state = false;                                // every kind, else the master weights alone
    std::size_t total = 0;                             // elements of the reader's buffer
    std::map<std::string, std::vector<float>> values;  // by kind, as the pieces show them
    std::map<std::string, std::vector<uint8_t>> seen;  // per element of the buffer
    // The per-matrix state asked for (MATRIX/ pieces), and what has arrived, whole; whether
    // the shards read hold any (a checkpoint of an optimizer without it holds none).
    std::map<std::string, std::size_t> matrices_wanted;
    std::map<std::string, std::vector<float>> matrices;
    bool any_matrix_state = false;

    // The buffers of a kind, made at its first piece.
    std::vector<float>& target(const std::string& kind) {
        auto [it, fresh] = values.try_emplace(kind);
        if (fresh) {
            it->second.assign(total, 0.0f);
            seen[kind].assign(total, 0);
        }
        return it->second;
    }
};

// The checkpoint holds the model and the adapters the config asks for.
void check_same_model(const std::string& dir, const Manifest& m, const model::ParamLayout& layout) {
    if (!same_model(m.shape, layout.shape()))
        throw Error(dir + ": holds another model (" + describe(m.shape) +
                    ") than the config asks for (" + describe(layout.shape()) + ")");
    const model::LoraShape lora = lora_shape(m.lora);
    if (lora.rank != layout.lora().rank || lora.targets != layout.lora().targets)
        throw Error(dir + ": trained " + describe(lora) + ", the config trains " +
                    describe(layout.lora()) + " (training.lora)");
}

// Whether the writer's slices hold anything this rank needs (else its file stays closed).
bool wanted(const model::ParamLayout& writer, int tp, const Gathering& g) {
    bool any = false;
    for (const model::ParamTensor& t : writer.tensors()) {
        const auto it = g.needs.find(t.name);
        if (it != g.needs.end() && !writer.held_elsewhere(t))
            overlaps(t, tp, 0, t.numel, it->second,
                     [&](std::size_t, std::size_t, std::size_t) { any = true; });
    }
    return any;
}

// Checks one piece's bytes against its digest in the file's header.
void check_piece_digest(const std::string& path, const io::SafetensorsFile& file,
                        const io::TensorInfo& info, const std::vector<char>& raw) {
    const auto digest = file.metadata().find("sha256/" + info.name);
    if (digest == file.metadata().end())
        throw Error(path + ": tensor \"" + info.name + "\" has no SHA-256 in the header");
    if (io::sha256_hex(std::string_view(raw.data(), raw.size())) != digest->second)
        throw Error(path + ": SHA-256 does not match for tensor \"" + info.name +
                    "\" (the file is corrupt)");
}

// A MATRIX/KIND/NAME piece into g.matrices where it is asked for; returns the bytes read.
uint64_t read_matrix_state(const std::string& path, const io::SafetensorsFile& file,
                           const io::TensorInfo& info, bool pieces_checked, Gathering& g) {
    const std::string name = info.name.substr(std::string("MATRIX/").size());
    g.any_matrix_state = true;
    const auto wanted = g.matrices_wanted.find(name);
    if (wanted == g.matrices_wanted.end()) return 0;
    if (info.dtype != kernels::DType::f32 || g.matrices.count(name))
        throw Error(path + ": tensor \"" + info.name + "\" is not fp32 or written twice");
    if (info.numel != wanted->second)
        throw Error(path + ": tensor \"" + info.name + "\" holds " + std::to_string(info.numel) +
                    " elements, this run keeps " + std::to_string(wanted->second) +
                    " (optimizer.galore.rank differs from the checkpoint's run)");
    std::vector<char> raw(info.data_end - info.data_begin);
    file.read_raw(info, raw);
    if (pieces_checked) check_piece_digest(path, file, info, raw);
    const float* values = reinterpret_cast<const float*>(raw.data());
    g.matrices[name].assign(values, values + info.numel);
    return raw.size();
}

// Reads the pieces of one shard file that this rank needs into `g`; adds the bytes read to
// `share`.
void read_shard(const std::string& path, const ManifestFile& f, const model::ParamLayout& writer,
                Gathering& g, CheckpointShare& share) {
    const io::SafetensorsFile file = io::SafetensorsFile::open(path);
    // The pieces' digests are in the header, and the header's in the manifest; a checkpoint
    // written without them is checked whole.
    const bool pieces_checked = !f.header_sha256.empty();
    if (pieces_checked && file.header_sha256() != f.header_sha256)
        throw Error(path +
                    ": SHA-256 of the header does not match the manifest (the file is "
                    "corrupt)");
    if (!pieces_checked) {
        if (io::sha256_file(path) != f.sha256)
            throw Error(path + ": SHA-256 does not match the manifest (the file is corrupt)");
        share.tensor_bytes += f.bytes;
    }
    uint64_t pieces_read = 0;
    std::vector<char> raw;
    for (const io::TensorInfo& info : file.tensors()) {
        if (info.name.rfind("MATRIX/", 0) == 0) {
            pieces_read += read_matrix_state(path, file, info, pieces_checked, g);
            continue;
        }
        const PieceName piece = parse_piece(info.name);
        if (info.name.rfind("param/", 0) == 0) continue;
        const model::ParamTensor* t = piece.kind.empty() ? nullptr : writer.find(piece.tensor);
        if (!t || piece.lo + info.numel > t->numel || info.dtype != kernels::DType::f32)
            throw Error(path + ": tensor \"" + info.name + "\" is not part of this rank's layout");
        if (piece.kind != optim::kMaster && !g.state) continue;
        const auto need = g.needs.find(t->name);
        if (need == g.needs.end()) continue;
        std::vector<std::array<std::size_t, 3>> takes;  // piece offset, count, local
        overlaps(*t, f.tp, piece.lo, info.numel, need->second,
                 [&](std::size_t at, std::size_t n, std::size_t local) {
                     takes.push_back({at, n, local});
                 });
        if (takes.empty()) continue;
        raw.resize(info.data_end - info.data_begin);
        file.read_raw(info, raw);
        pieces_read += raw.size();
        if (pieces_checked) check_piece_digest(path, file, info, raw);
        const float* values = reinterpret_cast<const float*>(raw.data());
        std::vector<float>& target = g.target(piece.kind);
        std::vector<uint8_t>& seen = g.seen[piece.kind];
        for (const auto& [at, n, local] : takes)
            for (std::size_t i = 0; i < n; ++i) {
                target[local + i] = values[at + i];
                if (seen[local + i]++)
                    throw Error(path + ": tensor \"" + info.name + "\" overlaps another shard");
            }
    }
    share.header_bytes += file.bytes_read() - pieces_read;
    share.tensor_bytes += pieces_read;
}

// Every element owned must have come from some shard, but for padded vocabulary rows past
// the writer's (`whole`: its whole tensors; zero in every layout).
// Every kind of state found holds every element (and the master weights are there).
void check_complete(const std::string& dir, const model::ParamLayout& whole, Gathering& g) {
    g.target(optim::kMaster);
    for (const auto& [kind, seen] : g.seen)
        for (const auto& [name, runs] : g.needs) {
            const std::size_t written = whole.find(name)->numel;
            for (const Need& r : runs)
                for (std::size_t i = 0; i < r.count && r.full + i < written; ++i)
                    if (!seen[r.local + i])
                        throw Error(dir + ": incomplete: no shard holds " + kind + " of \"" + name +
                                    "\" element " + std::to_string(r.full + i));
        }
}

}  // namespace

CheckpointShare read_share(const std::string& dir, const model::ParamLayout& layout,
                           const std::vector<std::pair<std::size_t, std::size_t>>& owned,
                           bool state, const std::map<std::string, std::size_t>& matrices) {
    CheckpointShare share;
    share.path = dir;
    share.manifest = read_manifest(dir);
    const Manifest& m = share.manifest;
    check_same_model(dir, m, layout);
    verify_sizes(dir, m);   // no reading
    verify_config(dir, m);  // what a resume compares with its own

    Gathering g;
    g.needs = needs_of(layout, owned);
    g.state = state;
    g.total = layout.total();
    g.matrices_wanted = matrices;
    const model::LoraShape lora = lora_shape(m.lora);
    for (const ManifestFile& f : m.files) {
        if (f.pp < 0) continue;
        const std::string path = (fs::path(dir) / f.name).string();
        if (f.pp >= m.layout.pipeline || f.tp >= m.layout.tensor || f.dp >= m.layout.data ||
            f.cp >= m.layout.context)
            throw Error(path + ": grid coordinates outside the manifest's layout");
        const model::ParamLayout writer =
            trained_layout(m.shape, lora, f.tp, m.layout.tensor,
                           model::StagePlan{m.layout.pipeline, f.pp, m.layout.virtual_stages,
                                            m.layout.chunk_layers, m.layout.placement()});
        // Per-matrix state lies with whichever rank stepped the matrix: every header is read.
        if (wanted(writer, f.tp, g) || !matrices.empty()) read_shard(path, f, writer, g, share);
    }
    check_complete(dir, trained_layout(m.shape, lora, 0, 1, {}), g);
    for (const auto& [name, count] : matrices)
        if (g.any_matrix_state && !g.matrices.count(name))
            throw Error(dir + ": incomplete: no shard holds MATRIX/" + name);
    share.master = std::move(g.values.at(optim::kMaster));
    g.values.erase(optim::kMaster);
    share.state = std::move(g.values);
    share.matrices = std::move(g.matrices);
    return share;
}

std::vector<std::string> damaged_parts(const std::string& dir, const ManifestFile& f) {
    const std::string path = (fs::path(dir) / f.name).string();
    const io::SafetensorsFile file = io::SafetensorsFile::open(path);
    if (file.header_sha256() != f.header_sha256) return {"header"};
    std::vector<std::string> damaged;
    std::vector<char> raw;
    for (const io::TensorInfo& info : file.tensors()) {
        raw.resize(info.data_end - info.data_begin);
        file.read_raw(info, raw);
        try {
            check_piece_digest(path, file, info, raw);
        } catch (const Error&) {
            damaged.push_back(info.name);
        }
    }
    return damaged;
}

void restore_checkpoint(const CheckpointShare& share, Trainer& trainer) {
    const Manifest& m = share.manifest;
    optim::OptimizerState state;
    state.step = m.adam_step;
    state.names.push_back(optim::kMaster);
    state.values.push_back(share.master);
    for (const auto& [name, values] : share.state) {
        state.names.push_back(name);
        state.values.push_back(values);
    }
    state.matrices = share.matrices;
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
            verify_config(dir, read_manifest(dir));
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
            loaded.base =
                load_base_weights(resolve_base(lora.base, dir), whole, loaded.params.data());
            if (base_weights_sha256(loaded.base) != lora.base_sha256)
                throw Error(dir + ": the base weights " + loaded.base +
                            " are not those the adapters were trained on (their SHA-256 "
                            "differs from the manifest's)");
            // A 4-bit base is recomputed from the base's file (deterministic): the adapters
            // were trained over its dequantized weights.
            if (adapters.quant_block)
                model::round_trip_base(whole, loaded.params.data(), adapters.quant_block,
                                       adapters.double_quant);
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
