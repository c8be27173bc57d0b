// Loading a config: the YAML file, then each --set override, then validation and derived
// values. Every value is read through the key table (schema.cpp), so a file and an override
// get the same checks; errors name the file line or the override, and the key path.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "config/schema.h"
#include "io/input_file.h"
#include "io/user_paths.h"

namespace trident::config {
namespace {

using detail::Key;
using detail::Origins;

// File ranks in Origins; overrides rank after it, in the order given.
constexpr int kFileRank = 1;

// No key's name is longer than this; a longer name is shown cut (with its length) and gets no
// suggestion, so that a huge unknown key (a pasted file) costs neither time nor memory nor a
// screenful of message.
constexpr std::size_t kLongestName = 64;

// `text` as a message shows it: whole when short, else its start and its length.
std::string shown(std::string_view text) {
    if (text.size() <= kLongestName) return std::string(text);
    return std::string(text.substr(0, kLongestName)) + "... (" + std::to_string(text.size()) +
           " bytes)";
}

[[noreturn]] void fail(const std::string& where, std::string_view path,
                       const std::string& problem) {
    throw ConfigError(where + ": " + shown(path) + ": " + problem);
}

std::string at_line(const std::string& file, const YAML::Mark& mark) {
    if (mark.is_null()) return file;
    return file + ":" + std::to_string(mark.line + 1);
}

// The known name a user most likely meant by `name`: a key of the same name in another
// section ("training.dropout" -> "model.dropout"), a key of the same section that starts with
// it ("training.warmup" -> "training.warmup_steps"), else the nearest by edit distance if it
// is within a third of the name (at least 2 edits allowed).
std::optional<std::string> suggestion(std::string_view name,
                                      const std::vector<std::string>& known) {
    if (name.size() > kLongestName) return std::nullopt;
    const std::string_view leaf = detail::leaf_of(name);
    for (const Key& key : detail::keys())
        if (detail::leaf_of(key.path) == leaf && key.path != name) return std::string(key.path);
    for (const Key& key : detail::keys())
        if (leaf.size() >= 3 && detail::section_of(key.path) == detail::section_of(name) &&
            detail::leaf_of(key.path).starts_with(leaf))
            return std::string(key.path);
    std::optional<std::string> best;
    size_t best_distance = std::max<size_t>(2, leaf.size() / 3) + 1;
    for (const std::string& candidate : known) {
        size_t distance = detail::edit_distance(name, candidate);
        if (distance < best_distance) {
            best = candidate;
            best_distance = distance;
        }
    }
    return best;
}

std::string unknown(std::string_view what, std::string_view name,
                    const std::vector<std::string>& known) {
    std::string message = "unknown " + std::string(what);
    if (auto guess = suggestion(name, known)) message += " (did you mean " + *guess + "?)";
    return message;
}

std::vector<std::string> key_paths() {
    std::vector<std::string> paths;
    for (const Key& key : detail::keys()) paths.emplace_back(key.path);
    return paths;
}

// The names allowed at the top of a file: sections and keys outside any section.
std::vector<std::string> top_level_names() {
    std::vector<std::string> names = detail::sections();
    for (const Key& key : detail::keys())
        if (detail::section_of(key.path).empty()) names.emplace_back(key.path);
    return names;
}

std::string join(const std::vector<std::string>& names) {
    std::string out;
    for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
    return out;
}

// No key has a control character in its name; one that does (a newline inside a quoted key)
// is shown escaped, so that the message stays one line.
bool plain_name(std::string_view name) {
    return std::none_of(name.begin(), name.end(),
                        [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7F; });
}

// yaml-cpp's message with any control character it quotes from the input escaped (\x0a).
std::string one_line(const std::string& text) {
    std::string out;
    for (char c : text) {
        if (static_cast<unsigned char>(c) >= 0x20 && c != 0x7F) {
            out += c;
            continue;
        }
        char escaped[8];
        std::snprintf(escaped, sizeof escaped, "\\x%02x", static_cast<unsigned char>(c));
        out += escaped;
    }
    return out;
}

std::string part_path(const Key& key, std::string_view part) {
    return std::string(key.path) + "." + std::string(part);
}

std::vector<std::string> part_paths(const Key& key) {
    std::vector<std::string> paths;
    for (const detail::Part& part : key.parts) paths.push_back(part_path(key, part.name));
    return paths;
}

// Reads one part of a key with parts; that part, and the key as a whole, now come from `where`.
void set_part(const Key& key, const detail::Part& part, const YAML::Node& value,
              const std::string& where, int rank, Config& cfg, Origins& origins) {
    const std::string path = part_path(key, part.name);
    YAML::Mark at = YAML::Mark::null_mark();
    if (auto problem = part.read(cfg, value, at)) {
        const bool from_file = rank == kFileRank;
        fail(from_file && !at.is_null() ? at_line(origins.file(), at) : where, path, *problem);
    }
    origins.set(path, where, rank);
    origins.set(key.path, where, rank);
}

// The map of a key with parts: every part back to its default, then each part given, read in
// turn. In a file each part points at its own line; every part not given points at the map.
void set_parts(const Key& key, const YAML::Node& value, const std::string& where, int rank,
               Config& cfg, Origins& origins) {
    if (!value.IsNull() && !value.IsMap()) {
        std::string names;
        for (const detail::Part& part : key.parts)
            names += (names.empty() ? "" : ", ") + std::string(part.name);
        fail(where, key.path, "expected a map of " + names + ", got " + detail::describe(value));
    }
    key.reset(cfg);
    origins.set(key.path, where, rank);
    for (const detail::Part& part : key.parts) origins.set(part_path(key, part.name), where, rank);
    if (value.IsNull()) return;

    const bool from_file = rank == kFileRank;
    std::map<std::string, size_t> first_line;  // part -> line it first appeared on
    for (const auto& entry : value) {
        const YAML::Mark mark = entry.first.Mark();
        const std::string part_where = from_file ? at_line(origins.file(), mark) : where;
        if (!entry.first.IsScalar() || !plain_name(entry.first.Scalar()))
            fail(part_where, key.path, "expected a key name, got " + detail::describe(entry.first));
        const std::string name = entry.first.Scalar();
        const std::string path = part_path(key, name);
        const detail::Part* part = detail::find_part(key, name);
        if (!part) fail(part_where, path, unknown("key", path, part_paths(key)));
        auto [it, fresh] = first_line.emplace(name, mark.line + 1);
        if (!fresh)
            fail(part_where, path,
                 from_file ? "given twice (first at line " + std::to_string(it->second) + ")"
                           : "given twice");
        set_part(key, *part, entry.second, part_where, rank, cfg, origins);
    }
}

void set_key(const Key& key, const YAML::Node& value, const std::string& where, int rank,
             Config& cfg, Origins& origins) {
    if (!key.parts.empty()) return set_parts(key, value, where, rank, cfg, origins);
    YAML::Mark at = YAML::Mark::null_mark();
    if (auto problem = key.read(cfg, value, at)) {
        // Inside a file, a problem within the value (an item of a list) points at its own line.
        const bool from_file = rank == kFileRank;
        fail(from_file && !at.is_null() ? at_line(origins.file(), at) : where, key.path, *problem);
    }
    origins.set(key.path, where, rank);
}

// Walks the document: top-level keys, then each section's keys. A name given twice is an
// error (yaml-cpp keeps both, and silently taking one would hide a mistake).
void apply_document(const YAML::Node& root, Config& cfg, Origins& origins) {
    const std::string& file = origins.file();
    if (root.IsNull()) return;  // an empty file: all defaults
    const std::vector<std::string> top_level = top_level_names();
    if (!root.IsMap())
        throw ConfigError(at_line(file, root.Mark()) + ": expected a map of " + join(top_level) +
                          ", got " + detail::describe(root));

    std::map<std::string, size_t> first_line;  // name -> line it first appeared on
    auto check_once = [&](const std::string& name, const YAML::Mark& mark,
                          const std::string& where) {
        auto [it, fresh] = first_line.emplace(name, mark.line + 1);
        if (!fresh)
            fail(where, name, "given twice (first at line " + std::to_string(it->second) + ")");
    };

    for (const auto& entry : root) {
        const YAML::Mark mark = entry.first.Mark();
        const std::string where = at_line(file, mark);
        if (!entry.first.IsScalar() || !plain_name(entry.first.Scalar()))
            throw ConfigError(where + ": expected a name (" + join(top_level) + "), got " +
                              detail::describe(entry.first));
        const std::string name = entry.first.Scalar();
        check_once(name, mark, where);

        if (const Key* key = detail::find_key(name)) {
            if (!detail::section_of(name).empty())
                fail(where, name,
                     "dotted paths are for --set; in a file, write the key under its section");
            set_key(*key, entry.second, where, kFileRank, cfg, origins);
            continue;
        }
        if (std::ranges::find(top_level, name) == top_level.end()) {
            const bool looks_like_section = entry.second.IsMap() || entry.second.IsNull();
            fail(where, name, unknown(looks_like_section ? "section" : "key", name, top_level));
        }

        const YAML::Node& section = entry.second;
        if (section.IsNull()) continue;  // "training:" with nothing under it
        if (!section.IsMap())
            fail(where, name, "expected a map of keys, got " + detail::describe(section));
        for (const auto& item : section) {
            const YAML::Mark item_mark = item.first.Mark();
            const std::string item_where = at_line(file, item_mark);
            if (!item.first.IsScalar() || !plain_name(item.first.Scalar()))
                fail(item_where, name, "expected a key name, got " + detail::describe(item.first));
            const std::string path = name + "." + item.first.Scalar();
            const Key* key = detail::find_key(path);
            if (!key) fail(item_where, path, unknown("key", path, key_paths()));
            check_once(path, item_mark, item_where);
            set_key(*key, item.second, item_where, kFileRank, cfg, origins);
        }
    }
}

// "a.b=value": the value is read as YAML, so 3e-4, true, null, 1f1b and [qkv, fc] mean what
// they mean in a file. Text that is not valid YAML is taken as a plain string, so a path
// like "data/[ab].bin" needs no quoting.
void apply_override(const std::string& text, int rank, Config& cfg, Origins& origins) {
    const std::string where = "--set " + shown(text);
    const size_t eq = text.find('=');
    if (eq == std::string::npos || eq == 0)
        throw ConfigError(where + ": expected key.path=value, e.g. training.lr=3e-4");
    const std::string path = text.substr(0, eq);
    const std::string value_text = text.substr(eq + 1);

    YAML::Node value;
    try {
        value = YAML::Load(value_text);
    } catch (const YAML::Exception&) {
        value = YAML::Node(value_text);
    }

    const Key* key = detail::find_key(path);
    if (!key) {
        // PATH.PART of a key with parts ("training.lora.rank") sets that part alone.
        for (const Key& owner : detail::keys()) {
            if (owner.parts.empty() || !path.starts_with(part_path(owner, ""))) continue;
            const std::string name = path.substr(owner.path.size() + 1);
            const detail::Part* part = detail::find_part(owner, name);
            if (!part) fail(where, path, unknown("key", path, part_paths(owner)));
            return set_part(owner, *part, value, where, rank, cfg, origins);
        }
        for (const Key& candidate : detail::keys())
            if (detail::section_of(candidate.path) == path)
                fail(where, path,
                     "is a section; set one of its keys, e.g. " + std::string(candidate.path));
        fail(where, path, unknown("key", path, key_paths()));
    }
    set_key(*key, value, where, rank, cfg, origins);
}

// training.eval_batches, the old spelling of the evaluation set, counted microbatches of
// samples 0, 1, ... that every replica evaluated alike: the same samples as eval_sequences =
// eval_batches × micro_batch, which replaces it (with a warning). Given both in one source,
// the two disagree; eval_sequences given by a later source (an override of a file's old key)
// takes its place, with a note.
void map_eval_batches(Config& cfg, const Origins& origins) {
    auto& t = cfg.training;
    if (!origins.is_set("training.eval_batches")) return;
    const std::string where = origins.where("training.eval_batches");
    const int old_rank = origins.rank("training.eval_batches"),
              new_rank = origins.rank("training.eval_sequences");
    if (new_rank == old_rank)
        fail(where, "training.eval_batches",
             "replaced by training.eval_sequences, which is given too: give eval_sequences alone");
    if (new_rank > old_rank) {
        cfg.notes.push_back(origins.where("training.eval_sequences") +
                            " replaces the deprecated training.eval_batches of " + where);
        t.eval_batches = 0;
        return;
    }
    if (t.eval_batches < 1)
        fail(where, "training.eval_batches", "must be >= 1, got " + std::to_string(t.eval_batches));
    t.eval_sequences = t.eval_batches * t.micro_batch;
    cfg.warnings.push_back(
        where +
        ": training.eval_batches is deprecated (it counted microbatches): read as "
        "training.eval_sequences = " +
        std::to_string(t.eval_batches) + " x micro_batch " + std::to_string(t.micro_batch) + " = " +
        std::to_string(t.eval_sequences) + "; write that instead");
    t.eval_batches = 0;
}

// Defaults that follow other keys, filled in after the file and every override so that they
// follow the final values; a key given anywhere keeps its value.
void fill_dependent_defaults(Config& cfg, const Origins& origins) {
    ModelConfig& m = cfg.model;
    // The family's MLP width, head and MLP kind (GPT-2's GELU at 4 x hidden, tied; Llama's
    // SwiGLU, untied), the linears its adapters wrap, and its tokenizer's end of document.
    const model::ArchDefaults family = model::arch_defaults(m.arch, m.hidden);
    if (!origins.is_set("model.ffn_hidden")) m.ffn_hidden = family.ffn;
    // Multi-head attention unless grouped.
    if (!origins.is_set("model.kv_heads")) m.kv_heads = m.heads;
    if (!origins.is_set("model.tie_embeddings")) m.tie_embeddings = family.tied;
    if (!origins.is_set("model.mlp")) m.mlp = family.mlp;
    // ZB-V's V holds two chunks per stage.
    if (cfg.parallel.schedule == pipeline::Kind::zb_v && !origins.is_set("parallel.virtual_stages"))
        cfg.parallel.virtual_stages = 2;
    if (!origins.is_set("training.lora.targets")) cfg.training.lora.targets = family.lora_targets;
    if (!origins.is_set("data.eod_token") && family.eod_token)
        cfg.data.eod_token = *family.eod_token;
    // Megatron-LM accumulates and reduces bf16 gradients in fp32: bf16's 8-bit mantissa drops
    // a small microbatch gradient added to a large sum. fp16 keeps 11 bits (and a loss scale).
    if (!origins.is_set("training.fp32_grad_accumulation"))
        cfg.training.fp32_grad_accumulation = cfg.training.precision == kernels::DType::bf16;
    // Each run's steps in its own file: beside its checkpoints.
    if (!origins.is_set("logging.metrics") && cfg.checkpoint.dir)
        cfg.logging.metrics =
            (std::filesystem::path(*cfg.checkpoint.dir) / "metrics.jsonl").string();
    // One global batch is a valid evaluation set on every layout of that batch.
    if (!origins.is_set("training.eval_sequences"))
        cfg.training.eval_sequences = cfg.training.global_batch;
    map_eval_batches(cfg, origins);
}

// A config is a few kilobytes; the cap stops a wrong path (a dataset, a device) early.
constexpr uint64_t kMaxConfigBytes = 16 << 20;

std::string read_file(const std::string& path) {
    if (const std::string problem = io::path_problem(path); !problem.empty())
        throw ConfigError("config file: " + problem);
    try {
        return io::read_regular_file(path, kMaxConfigBytes, "a config file");
    } catch (const Error& e) {
        throw ConfigError(std::string("config file ") + e.what());
    }
}

}  // namespace

Config parse(const std::string& yaml_text, const std::string& source,
             const std::vector<std::string>& overrides, Purpose purpose) {
    Config cfg;
    cfg.source = source;
    Origins origins(source);

    YAML::Node root;
    try {
        root = YAML::Load(yaml_text);
    } catch (const YAML::Exception& e) {
        throw ConfigError(at_line(source, e.mark) + ": invalid YAML: " + one_line(e.msg));
    }
    apply_document(root, cfg, origins);
    for (size_t i = 0; i < overrides.size(); ++i)
        apply_override(overrides[i], kFileRank + 1 + static_cast<int>(i), cfg, origins);
    detail::take_hf_config(cfg, origins);  // before the defaults that follow the shape
    fill_dependent_defaults(cfg, origins);

    detail::validate(cfg, origins, purpose);
    derive(cfg);
    return cfg;
}

Config load(const std::string& path, const std::vector<std::string>& overrides, Purpose purpose) {
    return parse(read_file(path), path, overrides, purpose);
}

}  // namespace trident::config
