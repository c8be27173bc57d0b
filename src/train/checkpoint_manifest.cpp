// The checkpoint manifest: JSON out and in, and the files' checks (see checkpoint_manifest.h).
#include "train/checkpoint_manifest.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "config/config.h"
#include "io/input_file.h"
#include "io/json_line.h"
#include "io/json_reader.h"
#include "io/sha256.h"
#include "kernels/error.h"

namespace trident::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "trident-checkpoint";
constexpr int kVersion = 1;
// The manifest's own SHA-256, its last member: of the manifest's text without it (the object
// closed where this member begins).
constexpr std::string_view kSealMember = ", \"manifest_sha256\": \"";
// A manifest lists one file per rank in a few hundred bytes each: 64 MiB is some 100 000 ranks.
constexpr uint64_t kMaxManifestBytes = 64 << 20;

bool is_checkpoint_name(const std::string& name) {
    return name.size() == 11 && name.rfind("step_", 0) == 0 &&
           std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Typed access to the members of a parsed manifest, each fault naming the file and the key.
class Reader {
public:
    explicit Reader(std::string path) : path_(std::move(path)) {}

    const io::json::Value& member(const io::json::Value& object, const char* key) const {
        const io::json::Value* v = object.is_object() ? object.find(key) : nullptr;
        if (!v) fail(std::string("missing \"") + key + "\"");
        return *v;
    }
    int64_t integer(const io::json::Value& object, const char* key) const {
        const io::json::Value& v = member(object, key);
        if (!v.is_integer()) fail(std::string("\"") + key + "\" is not an integer");
        return v.integer;
    }
    // An integer in [lo, hi], else a fault naming the key, the value and the range.
    int64_t ranged(const io::json::Value& object, const char* key, int64_t lo, int64_t hi) const {
        const int64_t v = integer(object, key);
        if (v < lo || v > hi)
            fail(std::string("\"") + key + "\" is " + std::to_string(v) + ", outside [" +
                 std::to_string(lo) + ", " + std::to_string(hi) + "]");
        return v;
    }
    int small(const io::json::Value& object, const char* key, int lo, int hi) const {
        return static_cast<int>(ranged(object, key, lo, hi));
    }
    double number(const io::json::Value& object, const char* key) const {
        const io::json::Value& v = member(object, key);
        if (v.is_integer()) return static_cast<double>(v.integer);
        if (v.kind != io::json::Value::Kind::real)
            fail(std::string("\"") + key + "\" is not a number");
        return v.real;
    }
    std::vector<double> numbers(const io::json::Value& object, const char* key) const {
        const io::json::Value& v = member(object, key);
        if (!v.is_array()) fail(std::string("\"") + key + "\" is not an array");
        std::vector<double> out;
        for (const io::json::Value& x : v.array) {
            if (x.is_integer())
                out.push_back(static_cast<double>(x.integer));
            else if (x.kind == io::json::Value::Kind::real)
                out.push_back(x.real);
            else
                fail(std::string("\"") + key + "\" holds something other than numbers");
        }
        return out;
    }
    const std::string& string(const io::json::Value& object, const char* key) const {
        const io::json::Value& v = member(object, key);
        if (!v.is_string()) fail(std::string("\"") + key + "\" is not a string");
        return v.string;
    }
    bool boolean(const io::json::Value& object, const char* key) const {
        const io::json::Value& v = member(object, key);
        if (v.kind != io::json::Value::Kind::boolean)
            fail(std::string("\"") + key + "\" is not true or false");
        return v.boolean;
    }
    [[noreturn]] void fail(const std::string& why) const { throw Error(path_ + ": " + why); }

private:
    std::string path_;
};

// A mixture of experts' settings that make the model (model.moe without its losses' weights),
// written where it has one.
void read_moe(const Reader& r, const io::json::Value& object, model::GptShape& shape) {
    model::MoeSettings& m = shape.moe;
    m.experts = r.small(object, "experts", 1, 4096);
    m.top_k = r.small(object, "top_k", 1, m.experts);
    m.ffn_hidden = r.small(object, "ffn_hidden", 1, config::limits::kFfn);
    m.shared_experts = r.small(object, "shared_experts", 0, 64);
    const std::string& router = r.string(object, "router");
    if (router != "softmax" && router != "sigmoid")
        r.fail("\"router\" is \"" + router + "\", not softmax or sigmoid");
    m.router = router == "sigmoid" ? model::MoeRouter::sigmoid : model::MoeRouter::softmax;
    m.normalize_top_k = r.boolean(object, "normalize_top_k");
    m.scale = r.number(object, "scale");
    m.first_dense = r.small(object, "first_dense", 0, shape.layers);
    m.every = r.small(object, "every", 1, shape.layers);
}

void moe_json(const model::MoeSettings& m, io::JsonLine& out) {
    out.add("experts", m.experts)
        .add("top_k", m.top_k)
        .add("ffn_hidden", m.ffn_hidden)
        .add("shared_experts", m.shared_experts)
        .add("router", m.router == model::MoeRouter::sigmoid ? "sigmoid" : "softmax")
        .add("normalize_top_k", m.normalize_top_k)
        .add("scale", m.scale)
        .add("first_dense", m.first_dense)
        .add("every", m.every);
}

// The model's sizes, each within the config's limits (config.h) and consistent, so that no
// size computed from them overflows.
void read_shape(const Reader& r, const io::json::Value& object, model::GptShape& shape) {
    namespace limits = config::limits;
    shape.vocab = r.small(object, "vocab_size", 1, limits::kVocab);
    shape.padded_vocab =
        r.small(object, "padded_vocab", shape.vocab, shape.vocab + 128 * limits::kRanks);
    shape.max_seq = r.small(object, "seq_len", 1, limits::kSeqLen);
    shape.layers = r.small(object, "layers", 1, limits::kLayers);
    shape.hidden = r.small(object, "hidden", 1, limits::kHidden);
    shape.heads = r.small(object, "heads", 1, shape.hidden);
    shape.ffn = r.small(object, "ffn_hidden", 1, limits::kFfn);
    if (shape.hidden % shape.heads != 0) r.fail("\"heads\" does not divide \"hidden\"");
    // Written since the llama layer; without them the model is GPT-2's.
    shape.kv_heads = shape.heads;
    if (object.find("arch")) {
        const std::string& arch = r.string(object, "arch");
        if (arch != "gpt2" && arch != "llama")
            r.fail("\"arch\" is \"" + arch + "\", not gpt2 or llama");
        shape.arch = arch == "llama" ? model::Arch::llama : model::Arch::gpt2;
        shape.kv_heads = r.small(object, "kv_heads", 1, shape.heads);
        if (shape.heads % shape.kv_heads != 0) r.fail("\"kv_heads\" does not divide \"heads\"");
        shape.tied = r.boolean(object, "tie_embeddings");
    }
    // Written where the MLP is not the family's own (model.mlp).
    shape.mlp = model::mlp_kind(shape);
    if (object.find("mlp")) {
        shape.mlp = r.string(object, "mlp");
        if (!model::is_mlp(shape.mlp)) r.fail("\"mlp\" is \"" + shape.mlp + "\", no kind of MLP");
    }
    // Written where the attention normalizes its query and key heads (model.qk_norm), and where
    // the heads are not hidden / heads wide (model.head_dim).
    if (object.find("qk_norm")) shape.qk_norm = r.boolean(object, "qk_norm");
    if (object.find("head_dim"))
        shape.head_dim = r.small(object, "head_dim", 2, config::limits::kHidden);
    if (const io::json::Value* moe = object.find("moe")) read_moe(r, *moe, shape);
}

}  // namespace

model::Placement CheckpointLayout::placement() const {
    return schedule == pipeline::to_string(pipeline::Kind::zb_v) ? model::Placement::v_shape
                                                                 : model::Placement::round_robin;
}

namespace {

// The writer's grid and schedule, each within the config's limits and fitting the model.
void read_layout(const Reader& r, const io::json::Value& object, const model::GptShape& shape,
                 CheckpointLayout& layout) {
    namespace limits = config::limits;
    layout.pipeline = r.small(object, "pipeline", 1, limits::kRanks);
    layout.tensor = r.small(object, "tensor", 1, shape.heads);
    layout.data = r.small(object, "data", 1, limits::kRanks);
    // Written since context parallelism; without it the sequence was not split.
    if (object.find("context")) {
        layout.context = r.small(object, "context", 1, shape.max_seq);
        layout.context_mode = r.string(object, "context_mode");
    }
    layout.virtual_stages = r.small(object, "virtual_stages", 1, limits::kVirtualStages);
    layout.schedule = r.string(object, "schedule");
    if (layout.placement() == model::Placement::v_shape &&
        (layout.virtual_stages != 2 || layout.pipeline < 2))
        r.fail("\"schedule\" zb-v needs \"virtual_stages\" 2 and \"pipeline\" at least 2");
    layout.zero_stage = r.small(object, "zero_stage", 0, 3);
    layout.bucket_size = r.ranged(object, "bucket_size", 0, INT32_MAX);  // (only shown)
    if (shape.heads % layout.tensor != 0 || shape.ffn % layout.tensor != 0 ||
        shape.padded_vocab % layout.tensor != 0)
        r.fail("\"tensor\" (" + std::to_string(layout.tensor) +
               ") does not divide the model's heads, ffn_hidden and padded vocabulary");
    // Written since cuts could be unequal; without it the chunks are equal.
    if (object.find("chunk_layers")) {
        const io::json::Value& cuts = r.member(object, "chunk_layers");
        if (!cuts.is_array()) r.fail("\"chunk_layers\" is not an array");
        int total = 0;
        for (const io::json::Value& n : cuts.array) {
            if (!n.is_integer() || n.integer < 0 || n.integer > shape.layers)
                r.fail("\"chunk_layers\" holds something other than a layer count");
            layout.chunk_layers.push_back(static_cast<int>(n.integer));
            total += static_cast<int>(n.integer);
        }
        if (total != shape.layers || static_cast<int64_t>(cuts.array.size()) !=
                                         int64_t{layout.pipeline} * layout.virtual_stages)
            r.fail("\"chunk_layers\" does not cut the model's layers into its chunks");
    } else if (shape.layers % (int64_t{layout.pipeline} * layout.virtual_stages) != 0)
        r.fail("\"pipeline\" x \"virtual_stages\" does not divide the model's layers");
}

}  // namespace

std::string checkpoint_name(int step) {
    char name[32];
    std::snprintf(name, sizeof name, "step_%06d", step);
    return name;
}

std::string describe_data_changes(const std::vector<DataFileRecord>& then,
                                  const std::vector<DataFileRecord>& now) {
    const auto of_key = [](const std::vector<DataFileRecord>& all, const std::string& key) {
        std::vector<const DataFileRecord*> files;
        for (const DataFileRecord& d : all)
            if (d.key == key) files.push_back(&d);
        return files;
    };
    std::vector<std::string> keys;
    for (const DataFileRecord& d : then)
        if (std::find(keys.begin(), keys.end(), d.key) == keys.end()) keys.push_back(d.key);
    std::string changes;
    const auto add = [&](const std::string& text) {
        changes += (changes.empty() ? "" : "; ") + text;
    };
    for (const std::string& key : keys) {
        const auto before = of_key(then, key), after = of_key(now, key);
        if (after.empty()) continue;  // the dataset is no longer read
        if (before.size() != after.size()) {
            add(key + ": " + std::to_string(after.size()) + " files now, " +
                std::to_string(before.size()) + " then");
            continue;
        }
        for (std::size_t i = 0; i < before.size(); ++i) {
            const DataFileRecord &b = *before[i], &a = *after[i];
            const std::string name =
                key + ": " + a.path + (a.path == b.path ? "" : " (then " + b.path + ")");
            if (a.bytes != b.bytes)
                add(name + ": " + std::to_string(a.bytes) + " bytes now, " +
                    std::to_string(b.bytes) + " then (" +
                    (a.bytes < b.bytes ? "truncated or replaced" : "grown or replaced") + ")");
            else if (a.sampled_sha256 != b.sampled_sha256)
                add(name +
                    ": the same size, other contents (its sampled SHA-256 differs: "
                    "replaced or edited)");
        }
    }
    return changes;
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
    std::vector<std::string> found;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec))
        if (entry.is_directory() && is_checkpoint_name(entry.path().filename().string()))
            found.push_back(entry.path().string());
    std::sort(found.begin(), found.end());  // zero-padded step numbers sort in step order
    return found;
}

std::string manifest_json(const Manifest& m) {
    io::JsonLine model, layout;
    model.add("arch", config::to_string(m.shape.arch))
        .add("vocab_size", m.shape.vocab)
        .add("padded_vocab", m.shape.padded_vocab)
        .add("seq_len", m.shape.max_seq)
        .add("layers", m.shape.layers)
        .add("hidden", m.shape.hidden)
        .add("heads", m.shape.heads)
        .add("ffn_hidden", m.shape.ffn)
        .add("kv_heads", m.shape.kv_heads)
        .add("tie_embeddings", m.shape.tied);
    if (!model::family_mlp(m.shape)) model.add("mlp", m.shape.mlp);
    if (m.shape.qk_norm) model.add("qk_norm", true);
    if (m.shape.head_dim > 0) model.add("head_dim", m.shape.head_dim);
    if (m.shape.moe.enabled()) {
        io::JsonLine moe;
        moe_json(m.shape.moe, moe);
        model.add("moe", moe);
    }
    layout.add("pipeline", m.layout.pipeline)
        .add("tensor", m.layout.tensor)
        .add("data", m.layout.data)
        .add("context", m.layout.context)
        .add("context_mode", m.layout.context_mode)
        .add("virtual_stages", m.layout.virtual_stages)
        .add("schedule", m.layout.schedule)
        .add("zero_stage", m.layout.zero_stage)
        .add("bucket_size", m.layout.bucket_size);
    const std::vector<int64_t> cuts(m.layout.chunk_layers.begin(), m.layout.chunk_layers.end());
    layout.add("chunk_layers", std::span<const int64_t>(cuts));
    std::vector<io::JsonLine> data;
    for (const DataFileRecord& d : m.data) {
        io::JsonLine j;
        j.add("key", d.key)
            .add("path", d.path)
            .add("bytes", static_cast<int64_t>(d.bytes))
            .add("sampled_sha256", d.sampled_sha256);
        data.push_back(j);
    }
    std::vector<io::JsonLine> files;
    for (const ManifestFile& f : m.files) {
        io::JsonLine j;
        j.add("name", f.name);
        if (f.pp >= 0) j.add("pp", f.pp).add("tp", f.tp).add("cp", f.cp).add("dp", f.dp);
        j.add("bytes", static_cast<int64_t>(f.bytes)).add("sha256", f.sha256);
        if (!f.header_sha256.empty()) j.add("header_sha256", f.header_sha256);
        files.push_back(j);
    }
    io::JsonLine j;
    j.add("format", kFormat)
        .add("version", kVersion)
        .add("step", m.step)
        .add("samples_consumed", m.samples_consumed)
        .add("seed", std::to_string(m.seed))  // a string: JSON integers stop at int64
        .add("adam_step", m.adam_step)
        .add_exact("loss_scale", m.loss_scale)
        .add("good_steps", m.good_steps)
        .add("skipped_total", m.skipped_total)
        .add("skipped_in_a_row", m.skipped_in_a_row)
        .add_exact("recent_losses", std::span<const double>(m.recent_losses))
        .add_exact("recent_grad_norms", std::span<const double>(m.recent_grad_norms))
        .add("model", model)
        .add("layout", layout)
        .add("precision", m.precision)
        .add("files", files)
        .add("data", data);
    if (m.lora.rank > 0) {
        io::JsonLine lora;
        lora.add("rank", m.lora.rank)
            .add("targets", std::span<const std::string>(m.lora.targets))
            .add_exact("alpha", m.lora.alpha)
            .add("base", m.lora.base)
            .add("base_sha256", m.lora.base_sha256);
        j.add("lora", lora);
    }
    const std::string text = j.str();  // {...}
    return text.substr(0, text.size() - 1) + std::string(kSealMember) + io::sha256_hex(text) +
           "\"}\n";
}

namespace {

// The run's progress: steps, samples, seed, the optimizer's and the loss scale's counters, the
// step guard's state.
void read_progress(const Reader& r, const io::json::Value& root, Manifest& m) {
    m.step = r.small(root, "step", 1, INT32_MAX);
    m.samples_consumed = r.ranged(root, "samples_consumed", 0, INT64_MAX);
    // Digits only: std::stoull would take "-1" as 2^64 - 1.
    const std::string& seed = r.string(root, "seed");
    try {
        if (seed.empty() || seed.find_first_not_of("0123456789") != std::string::npos)
            throw std::invalid_argument(seed);
        m.seed = std::stoull(seed);
    } catch (const std::logic_error&) {
        r.fail("\"seed\" is not a number of 0 to 2^64 - 1");
    }
    // Updates applied: at most the steps taken (fewer by those skipped on overflow).
    m.adam_step = r.small(root, "adam_step", 0, m.step);
    m.loss_scale = r.number(root, "loss_scale");
    if (!(m.loss_scale > 0) || !std::isfinite(m.loss_scale))
        r.fail("\"loss_scale\" is not a positive finite number");
    m.good_steps = r.small(root, "good_steps", 0, m.step);
    m.skipped_total = r.small(root, "skipped_total", 0, m.step);
    // Written since the step guard; without it nothing was skipped in a row or measured.
    if (root.find("skipped_in_a_row")) {
        m.skipped_in_a_row = r.small(root, "skipped_in_a_row", 0, m.step);
        m.recent_losses = r.numbers(root, "recent_losses");
        m.recent_grad_norms = r.numbers(root, "recent_grad_norms");
    }
}

// The shards, with their grid coordinates, sizes and digests.
void read_files(const Reader& r, const io::json::Value& root, Manifest& m) {
    const io::json::Value& files = r.member(root, "files");
    if (!files.is_array()) r.fail("\"files\" is not an array");
    for (const io::json::Value& f : files.array) {
        ManifestFile mf;
        mf.name = r.string(f, "name");
        if (mf.name.empty() || mf.name.find('/') != std::string::npos || mf.name[0] == '.')
            r.fail("bad file name \"" + mf.name + "\"");
        if (f.find("pp")) {
            const CheckpointLayout& l = m.layout;
            mf.pp = r.small(f, "pp", 0, l.pipeline - 1);
            mf.tp = r.small(f, "tp", 0, l.tensor - 1);
            if (f.find("cp")) mf.cp = r.small(f, "cp", 0, l.context - 1);
            mf.dp = r.small(f, "dp", 0, l.data - 1);
        }
        mf.bytes = static_cast<uint64_t>(r.ranged(f, "bytes", 0, INT64_MAX));
        mf.sha256 = r.string(f, "sha256");
        if (f.find("header_sha256")) mf.header_sha256 = r.string(f, "header_sha256");
        m.files.push_back(std::move(mf));
    }
}

void read_data(const Reader& r, const io::json::Value& root, Manifest& m) {
    // Recorded since resumes check their data; without it there is nothing to compare.
    if (const io::json::Value* data = root.find("data")) {
        if (!data->is_array()) r.fail("\"data\" is not an array");
        for (const io::json::Value& d : data->array) {
            DataFileRecord record;
            record.key = r.string(d, "key");
            record.path = r.string(d, "path");
            record.bytes = static_cast<uint64_t>(r.ranged(d, "bytes", 0, INT64_MAX));
            record.sampled_sha256 = r.string(d, "sampled_sha256");
            m.data.push_back(std::move(record));
        }
        m.data_recorded = true;
    }
}

// The manifest's own SHA-256 against its text (manifest_json): an edit of any field (a step
// of 6 made 7) is a corrupt manifest, not a checkpoint of step 7. Written since checksummed
// manifests; one without it is read as before.
void check_seal(const Reader& r, const io::json::Value& root, const std::string& text) {
    if (!root.find("manifest_sha256")) return;
    const std::string& seal = r.string(root, "manifest_sha256");
    const std::size_t at = text.rfind(kSealMember);
    if (at == std::string::npos || io::sha256_hex(text.substr(0, at) + "}") != seal)
        r.fail(
            "its own SHA-256 (\"manifest_sha256\") does not match its contents: edited or "
            "corrupt");
}

void read_lora(const Reader& r, const io::json::Value& root, Manifest& m) {
    // Written by runs that trained low-rank adapters.
    if (const io::json::Value* lora = root.find("lora")) {
        m.lora.rank = r.small(*lora, "rank", 1, m.shape.hidden);
        const io::json::Value& targets = r.member(*lora, "targets");
        if (!targets.is_array()) r.fail("\"targets\" of \"lora\" is not an array");
        for (const io::json::Value& t : targets.array) {
            if (!t.is_string()) r.fail("\"targets\" of \"lora\" holds something other than a name");
            m.lora.targets.push_back(t.string);
        }
        m.lora.alpha = r.number(*lora, "alpha");
        if (!(m.lora.alpha > 0) || !std::isfinite(m.lora.alpha))
            r.fail("\"alpha\" of \"lora\" is not a positive finite number");
        m.lora.base = r.string(*lora, "base");
        m.lora.base_sha256 = r.string(*lora, "base_sha256");
        if (m.lora.rank < 1 || m.lora.targets.empty()) r.fail("\"lora\" has no rank or no targets");
    }
}

}  // namespace

Manifest read_manifest(const std::string& dir) {
    const std::string path = (fs::path(dir) / kManifestName).string();
    if (!fs::exists(fs::symlink_status(path)))
        throw Error(path + ": missing (an incomplete checkpoint, or not a checkpoint)");
    const std::string text = io::read_regular_file(path, kMaxManifestBytes, "a manifest");
    io::json::Value root;
    try {
        root = io::json::parse(text);
    } catch (const Error& e) {
        throw Error(path + ": not valid JSON: " + e.what());
    }
    const Reader r(path);
    if (r.string(root, "format") != kFormat) r.fail("not a Trident checkpoint manifest");
    if (r.integer(root, "version") != kVersion)
        r.fail("format version " + std::to_string(r.integer(root, "version")) +
               " (this build reads version " + std::to_string(kVersion) + ")");
    Manifest m;
    read_progress(r, root, m);
    read_shape(r, r.member(root, "model"), m.shape);
    read_layout(r, r.member(root, "layout"), m.shape, m.layout);
    m.precision = r.string(root, "precision");
    if (m.precision != "fp32" && m.precision != "bf16" && m.precision != "fp16")
        r.fail("\"precision\" is \"" + m.precision + "\", not fp32, bf16 or fp16");
    read_files(r, root, m);
    read_data(r, root, m);
    read_lora(r, root, m);
    check_seal(r, root, text);  // last: a field out of its range is named as such
    return m;
}

void verify_config(const std::string& dir, const Manifest& m) {
    for (const ManifestFile& f : m.files) {
        if (f.name != "config.yaml") continue;
        const std::string path = (fs::path(dir) / f.name).string();
        ::close(io::open_regular(path));  // a FIFO or a device is named as such
        if (io::sha256_file(path) != f.sha256)
            throw Error(path +
                        ": SHA-256 does not match the manifest: edited or corrupt (set what is "
                        "to differ in the resuming run's config, not in a checkpoint's)");
    }
}

void verify_sizes(const std::string& dir, const Manifest& m) {
    for (const ManifestFile& f : m.files) {
        const std::string path = (fs::path(dir) / f.name).string();
        std::error_code ec;
        if (fs::exists(fs::symlink_status(path)) && !fs::is_regular_file(path))
            ::close(io::open_regular(path));  // throws, naming what it is
        const auto size = fs::file_size(path, ec);
        if (ec) throw Error(path + ": missing (the checkpoint is incomplete)");
        if (size != f.bytes)
            throw Error(path + ": " + std::to_string(size) + " bytes, the manifest says " +
                        std::to_string(f.bytes) + " (truncated or overwritten)");
    }
}

std::string file_problem(const std::string& dir, const ManifestFile& f) {
    const std::string path = (fs::path(dir) / f.name).string();
    if (fs::exists(fs::symlink_status(path)) && !fs::is_regular_file(path))
        return "NOT A REGULAR FILE";
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (ec) return "MISSING";
    if (size != f.bytes) return "WRONG SIZE (" + std::to_string(size) + " bytes)";
    if (io::sha256_file(path) != f.sha256) return "CORRUPT (checksum differs)";
    return "";
}

}  // namespace trident::train
