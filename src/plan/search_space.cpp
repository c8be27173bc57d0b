// The search's layouts, its keys and its rules (see search_space.h).
#include "plan/search_space.h"

#include <array>
#include <type_traits>

#include "kernels/error.h"

namespace trident::plan {

namespace {

using pipeline::Kind;

// One key the search varies: its path, its value's canonical text from a --fix value (throws a
// problem for a bad one), and a layout's value as that text.
struct SearchKey {
    const char* path;
    std::string (*canonical)(const std::string& value);
    std::string (*of)(const Layout& layout);
};

std::string bad_value(const char* expected) {
    throw Error(std::string("expected ") + expected);
}

int integer(const std::string& value, int least, const char* expected) {
    std::size_t end = 0;
    int v = 0;
    try {
        v = std::stoi(value, &end);
    } catch (const std::exception&) {
        end = 0;
    }
    if (end == 0 || end != value.size() || v < least) bad_value(expected);
    return v;
}

std::string count(const std::string& value) {
    return std::to_string(integer(value, 1, "a positive integer"));
}
std::string zero_stage(const std::string& value) {
    const int v = integer(value, 0, "0, 1, 2 or 3");
    if (v > 3) bad_value("0, 1, 2 or 3");
    return std::to_string(v);
}
std::string data_shard(const std::string& value) {
    return std::to_string(integer(value, 0, "0 (every D·C rank) or a number of ranks"));
}
std::string boolean(const std::string& value) {
    if (value != "true" && value != "false") bad_value("true or false");
    return value;
}
std::string schedule(const std::string& value) {
    return pipeline::to_string(pipeline::parse_kind(value));
}
constexpr std::array<config::Recompute, 3> kRecomputes = {
    config::Recompute::none, config::Recompute::selective, config::Recompute::full};
std::string recompute(const std::string& value) {
    for (const config::Recompute r : kRecomputes)
        if (value == config::to_string(r)) return value;
    return bad_value("none, selective or full");
}
std::string text(bool b) {
    return b ? "true" : "false";
}

// The keys in the order of keys() below.
enum KeyIndex : std::size_t {
    kPipeline,
    kTensor,
    kContext,
    kData,
    kSchedule,
    kVirtualStages,
    kMicroBatch,
    kZeroStage,
    kDataShard,
    kSequenceParallel,
    kTpOverlap,
    kRecompute,
    kKeys
};

const std::array<SearchKey, kKeys>& keys() {
    static const std::array<SearchKey, kKeys> all = {{
        {"parallel.pipeline", count, [](const Layout& l) { return std::to_string(l.pipeline); }},
        {"parallel.tensor", count, [](const Layout& l) { return std::to_string(l.tensor); }},
        {"parallel.context", count, [](const Layout& l) { return std::to_string(l.context); }},
        {"parallel.data", count, [](const Layout& l) { return std::to_string(l.data); }},
        {"parallel.schedule", schedule,
         [](const Layout& l) { return std::string(pipeline::to_string(l.schedule)); }},
        {"parallel.virtual_stages", count,
         [](const Layout& l) { return std::to_string(l.virtual_stages); }},
        {"training.micro_batch", count,
         [](const Layout& l) { return std::to_string(l.micro_batch); }},
        {"parallel.zero_stage", zero_stage,
         [](const Layout& l) { return std::to_string(l.zero_stage); }},
        {"parallel.data_shard", data_shard,
         [](const Layout& l) { return std::to_string(l.data_shard); }},
        {"parallel.sequence_parallel", boolean,
         [](const Layout& l) { return text(l.sequence_parallel); }},
        {"parallel.tp_overlap", boolean, [](const Layout& l) { return text(l.tp_overlap); }},
        {"training.recompute", recompute,
         [](const Layout& l) { return std::string(config::to_string(l.recompute)); }},
    }};
    return all;
}

// The layout the config itself describes, in the search's keys.
Layout layout_of(const config::Config& cfg) {
    const auto& p = cfg.parallel;
    return {p.pipeline,
            p.tensor,
            p.context,
            p.data,
            p.schedule,
            p.virtual_stages,
            cfg.training.micro_batch,
            p.zero_stage,
            p.data_shard,
            p.sequence_parallel,
            p.tp_overlap,
            cfg.training.recompute};
}

std::vector<int> divisors(int n) {
    std::vector<int> out;
    for (int d = 1; d <= n; ++d)
        if (n % d == 0) out.push_back(d);
    return out;
}

}  // namespace

config::Config apply(const config::Config& base, const Layout& layout) {
    config::Config cfg = base;
    auto& p = cfg.parallel;
    p.pipeline = layout.pipeline;
    p.tensor = layout.tensor;
    p.context = layout.context;
    p.data = layout.data;
    p.schedule = layout.schedule;
    p.virtual_stages = layout.virtual_stages;
    p.zero_stage = layout.zero_stage;
    p.data_shard = layout.data_shard;
    p.sequence_parallel = layout.sequence_parallel;
    p.tp_overlap = layout.tp_overlap;
    cfg.training.micro_batch = layout.micro_batch;
    cfg.training.recompute = layout.recompute;
    config::derive(cfg);
    return cfg;
}

std::vector<std::string> key_values(const Layout& layout) {
    std::vector<std::string> out;
    for (const SearchKey& key : keys()) {
        std::string assignment = key.path;
        out.push_back(assignment.append("=").append(key.of(layout)));
    }
    return out;
}

std::vector<std::string> set_overrides(const config::Config& base, const Layout& layout) {
    const std::vector<std::string> mine = key_values(layout), theirs = key_values(layout_of(base));
    std::vector<std::string> out;
    for (std::size_t k = 0; k < mine.size(); ++k)
        if (mine[k] != theirs[k]) out.push_back(mine[k]);
    return out;
}

std::vector<std::string> search_keys() {
    std::vector<std::string> out;
    for (const SearchKey& key : keys()) out.push_back(key.path);
    return out;
}

std::vector<std::string> differences(const Layout& a, const Layout& b) {
    std::vector<std::string> out;
    for (const SearchKey& key : keys())
        if (key.of(a) != key.of(b)) {
            std::string text = key.path;
            out.push_back(text.append(" ").append(key.of(a)).append(" against ").append(key.of(b)));
        }
    return out;
}

void Fixes::add(const std::string& assignment) {
    const std::size_t eq = assignment.find('=');
    const std::string key = assignment.substr(0, eq);
    if (eq == std::string::npos || key.empty())
        throw Error("--fix " + assignment + ": expected key=value, e.g. parallel.tensor=8");
    for (const SearchKey& k : keys()) {
        if (key != k.path) continue;
        try {
            held_[key] = k.canonical(assignment.substr(eq + 1));
        } catch (const Error& e) {
            throw Error("--fix " + assignment + ": " + e.what());
        }
        given_.push_back(assignment);
        return;
    }
    std::string known;
    for (const SearchKey& k : keys()) known += (known.empty() ? "" : ", ") + std::string(k.path);
    throw Error("--fix " + assignment + ": unknown key '" + key + "'; the search varies " + known +
                " (other keys: --set)");
}

bool Fixes::allows(const Layout& layout) const {
    for (const SearchKey& k : keys()) {
        const auto it = held_.find(k.path);
        if (it != held_.end() && it->second != k.of(layout)) return false;
    }
    return true;
}

std::string Fixes::text() const {
    std::string out;
    for (const std::string& g : given_) out += (out.empty() ? "--fix " : " --fix ") + g;
    return out;
}

std::optional<std::string> Fixes::held(const std::string& key) const {
    const auto it = held_.find(key);
    if (it == held_.end()) return std::nullopt;
    return it->second;
}

namespace {

// The enumeration: a loop per level (grid, micro batch, schedule, recompute, tensor options),
// each value first held against --fix, then against the rules; a value ruled out is counted
// under the rule's text.
class Enumeration {
public:
    Enumeration(const config::Config& base, const SearchSpace& space, Rejections& rejected)
        : cfg_(base), space_(space), rejected_(rejected) {
        for (std::size_t k = 0; k < kKeys; ++k) held_[k] = space.fixes.held(keys()[k].path);
    }

    void run(const std::function<void(const LayoutGroup&)>& visit);

private:
    // Whether --fix holds `key` at another value.
    bool fixed_out(std::size_t key, const std::string& value) const {
        return held_[key] && *held_[key] != value;
    }
    bool fixed_out(std::size_t key, int value) const {
        return held_[key] && *held_[key] != std::to_string(value);
    }
    // Counts a candidate the rule `text` (a string, or what makes it) rules out when `broken`;
    // returns `broken`.
    template <typename Text>
    bool rule(bool broken, const Text& text) {
        if (!broken) return false;
        if constexpr (std::is_invocable_v<Text>)
            ++rejected_[text()];
        else
            ++rejected_[text];
        return true;
    }
    bool tensor_ok(int M);
    bool context_ok(int M, int C);
    bool grid_ok(int P, int D);
    std::vector<Sharding> shardings(int data_context);
    void micro_batches(LayoutGroup& group, const std::function<void(const LayoutGroup&)>& visit);
    void schedules(LayoutGroup& group, int microbatches,
                   const std::function<void(const LayoutGroup&)>& visit);
    void tensor_options(LayoutGroup& group, const std::function<void(const LayoutGroup&)>& visit);

    const config::Config& cfg_;
    const SearchSpace& space_;
    Rejections& rejected_;
    std::array<std::optional<std::string>, kKeys> held_;  // by key index, as --fix holds them
};

bool Enumeration::tensor_ok(int M) {
    const auto& m = cfg_.model;
    const std::string heads = std::to_string(m.heads), kv = std::to_string(m.kv_heads);
    if (rule(m.heads % M != 0, "parallel.tensor must divide model.heads (" + heads + ")") ||
        rule(m.ffn_hidden % M != 0,
             "parallel.tensor must divide model.ffn_hidden (" + std::to_string(m.ffn_hidden) + ")"))
        return false;
    // With as many key/value heads as query heads (GPT-2's attention) these follow from the
    // rule above.
    if (rule(m.kv_heads % M != 0 && M % m.kv_heads != 0,
             "parallel.tensor must divide model.kv_heads (" + kv + ") or be a multiple of it") ||
        rule(cfg_.training.lora.enabled() && M > m.kv_heads,
             "training.lora needs parallel.tensor <= model.kv_heads (" + kv + ")"))
        return false;
    return !rule(!space_.cross_node_tensor && space_.gpus_per_node % M != 0,
                 "parallel.tensor must divide the GPUs per node (" +
                     std::to_string(space_.gpus_per_node) + "; --allow-cross-node-tp lifts it)");
}

bool Enumeration::context_ok(int M, int C) {
    const auto& m = cfg_.model;
    if (rule(C > 1 && m.seq_len % (2 * C) != 0,
             "2 x parallel.context must divide model.seq_len (" + std::to_string(m.seq_len) + ")"))
        return false;
    return !rule(C > 1 && cfg_.parallel.context_mode == model::ContextMode::ulysses &&
                     m.heads % (M * C) != 0,
                 "parallel.context_mode ulysses: parallel.tensor x context must divide "
                 "model.heads (" +
                     std::to_string(m.heads) + ")");
}

bool Enumeration::grid_ok(int P, int D) {
    const auto& t = cfg_.training;
    return !rule(P > cfg_.model.layers, "parallel.pipeline must not exceed model.layers (" +
                                            std::to_string(cfg_.model.layers) + ")") &&
           !rule(t.global_batch % D != 0, "parallel.data must divide training.global_batch (" +
                                              std::to_string(t.global_batch) + ")") &&
           !rule(t.eval_sequences % D != 0, "parallel.data must divide training.eval_sequences (" +
                                                std::to_string(t.eval_sequences) + ")");
}

std::vector<Sharding> Enumeration::shardings(int data_context) {
    const auto& p = cfg_.parallel;
    // Only stage 3 shards the parameters that a file or a kept gather needs sharded.
    const bool stage3_only = cfg_.optimizer.offload_params || !p.reshard_after_forward;
    std::vector<Sharding> out;
    // The experts split over E ranks of the data-context group (and of each shard group).
    if (rule(data_context % p.expert != 0, "parallel.expert must divide parallel.data x context"))
        return out;
    for (int zero = 0; zero <= 3; ++zero) {
        if (fixed_out(kZeroStage, zero)) continue;
        if (rule(stage3_only && zero != 3,
                 "optimizer.offload_params or parallel.reshard_after_forward false needs "
                 "parallel.zero_stage 3"))
            continue;
        // With one rank holding each weight there is nothing to shard: the lowest stage only.
        if (rule(data_context == 1 && !out.empty(),
                 "one rank of data x context shards nothing: one ZeRO stage"))
            continue;
        for (int shard = 0; shard < data_context; ++shard) {
            if (fixed_out(kDataShard, shard)) continue;
            if (shard > 0 &&
                (rule(data_context % shard != 0,
                      "parallel.data_shard must divide parallel.data x context") ||
                 rule(shard == 1 || zero == 0,
                      "parallel.data_shard: 2 to D x C - 1 ranks, at ZeRO 1 to 3") ||
                 rule(shard % p.expert != 0, "parallel.expert must divide parallel.data_shard")))
                continue;
            out.push_back({zero, shard});
        }
    }
    return out;
}

void Enumeration::run(const std::function<void(const LayoutGroup&)>& visit) {
    const int N = space_.gpus;
    for (const int M : divisors(N)) {
        if (fixed_out(kTensor, M) || !tensor_ok(M)) continue;
        for (const int C : divisors(N / M)) {
            if (fixed_out(kContext, C) || !context_ok(M, C)) continue;
            for (const int P : divisors(N / M / C)) {
                const int D = N / M / C / P;
                if (fixed_out(kPipeline, P) || fixed_out(kData, D) || !grid_ok(P, D)) continue;
                LayoutGroup group;
                group.layout.pipeline = P;
                group.layout.tensor = M;
                group.layout.context = C;
                group.layout.data = D;
                group.shardings = shardings(D * C);
                if (group.shardings.empty()) continue;
                micro_batches(group, visit);
            }
        }
    }
}

void Enumeration::micro_batches(LayoutGroup& group,
                                const std::function<void(const LayoutGroup&)>& visit) {
    const auto& t = cfg_.training;
    const int D = group.layout.data;
    for (const int b : divisors(t.global_batch / D)) {
        if (fixed_out(kMicroBatch, b)) continue;
        if (rule(t.eval_sequences % (b * D) != 0, [&] {
                return "training.micro_batch x parallel.data must divide "
                       "training.eval_sequences (" +
                       std::to_string(t.eval_sequences) + ")";
            }))
            continue;
        group.layout.micro_batch = b;
        schedules(group, t.global_batch / (b * D), visit);
    }
}

void Enumeration::schedules(LayoutGroup& group, int microbatches,
                            const std::function<void(const LayoutGroup&)>& visit) {
    const int P = group.layout.pipeline, layers = cfg_.model.layers;
    const config::StageLayers& cut = cfg_.parallel.stage_layers;
    for (const Kind kind : {Kind::one_f_one_b, Kind::interleaved, Kind::zb_h1, Kind::zb_h2,
                            Kind::zb_v, Kind::gpipe}) {
        const char* name = pipeline::to_string(kind);
        if (fixed_out(kSchedule, name)) continue;
        // GPipe only when asked for; one stage runs every schedule as 1f1b.
        if (kind == Kind::gpipe && !held_[kSchedule]) continue;
        if (rule(P == 1 && kind != Kind::one_f_one_b, "one pipeline stage: parallel.schedule 1f1b"))
            continue;
        const int first = kind == Kind::interleaved || kind == Kind::zb_v ? 2 : 1;
        const int last = kind == Kind::interleaved ? layers / P : first;
        for (int v = first; v <= std::max(first, last); ++v) {
            if (fixed_out(kVirtualStages, v)) continue;
            const int chunks = P * v;
            if (rule(
                    chunks > layers,
                    [&] {
                        return "parallel.pipeline x virtual_stages must not exceed model.layers (" +
                               std::to_string(layers) + ")";
                    }) ||
                rule(cut.cut == config::StageCut::uniform && layers % chunks != 0,
                     "parallel.stage_layers uniform: parallel.pipeline x virtual_stages must "
                     "divide model.layers") ||
                rule(cut.cut == config::StageCut::given &&
                         chunks != static_cast<int>(cut.layers.size()),
                     "parallel.stage_layers: parallel.pipeline x virtual_stages must be its "
                     "count of chunks") ||
                rule(kind == Kind::interleaved && microbatches % P != 0,
                     "parallel.schedule interleaved: parallel.pipeline must divide the "
                     "microbatches per step"))
                continue;
            group.layout.schedule = kind;
            group.layout.virtual_stages = v;
            tensor_options(group, visit);
        }
    }
}

void Enumeration::tensor_options(LayoutGroup& group,
                                 const std::function<void(const LayoutGroup&)>& visit) {
    Layout& l = group.layout;
    const int rows = l.micro_batch * (cfg_.model.seq_len / l.context);
    for (const config::Recompute recompute : kRecomputes) {
        if (fixed_out(kRecompute, config::to_string(recompute))) continue;
        l.recompute = recompute;
        for (int option = 0; option < 3; ++option) {  // off; sequence parallel; and overlapped
            l.sequence_parallel = option > 0;
            l.tp_overlap = option > 1;
            if (fixed_out(kSequenceParallel, text(l.sequence_parallel)) ||
                fixed_out(kTpOverlap, text(l.tp_overlap)))
                continue;
            if (rule(option > 0 && l.tensor == 1,
                     "parallel.sequence_parallel and tp_overlap need parallel.tensor > 1") ||
                rule(option > 0 && rows % l.tensor != 0,
                     "parallel.sequence_parallel: parallel.tensor must divide micro_batch x "
                     "seq_len / context"))
                continue;
            visit(group);
        }
    }
}

}  // namespace

void enumerate(const config::Config& base, const SearchSpace& space,
               const std::function<void(const LayoutGroup&)>& visit, Rejections& rejected) {
    Enumeration(base, space, rejected).run(visit);
}

}  // namespace trident::plan
