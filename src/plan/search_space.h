// The layouts `trident plan --search` chooses among, and the rules that rule layouts out before
// anything is modelled (docs/FEATURES.md, "Searching for a layout"). A layout is the keys the
// search varies: the grid P × M × C × D, the schedule and its chunks per stage, the micro batch,
// the ZeRO stage and its shard group, sequence parallelism and its overlap, and recompute; every
// other key is the config's. The rules are the config's own checks (src/config/validate.cpp) on
// those keys, and the search's:
// - the tensor group within a node (M divides the GPUs per node) unless told otherwise;
// - every pipeline chunk holds a layer at least (P·v ≤ layers);
// - no two layouts that run the same: one pipeline stage runs 1f1b only, a grid without data
//   or context parallelism ZeRO stage 0 only (there is nothing to shard), a shard group is
//   between 2 and D·C − 1 ranks (D·C itself is the default, 0) and only at stages 1 to 3,
//   sequence parallelism and its overlap need M > 1;
// - GPipe only where --fix asks for it (1F1B has its bubble with fewer activations).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"

namespace trident::plan {

struct Layout {
    int pipeline = 1, tensor = 1, context = 1, data = 1;  // P, M, C, D
    pipeline::Kind schedule = pipeline::Kind::one_f_one_b;
    int virtual_stages = 1;
    int micro_batch = 1;
    int zero_stage = 0;
    int data_shard = 0;  // 0: all D·C ranks
    bool sequence_parallel = false;
    bool tp_overlap = false;
    config::Recompute recompute = config::Recompute::none;
    bool operator==(const Layout&) const = default;
};

// The config with the layout's keys set, its derived values recomputed.
config::Config apply(const config::Config& base, const Layout& layout);

// The layout's keys as --set and --fix take them ("parallel.tensor=8"): every one, or those
// that differ from `base`'s.
std::vector<std::string> key_values(const Layout& layout);
std::vector<std::string> set_overrides(const config::Config& base, const Layout& layout);

// The search's keys, as --fix names them.
std::vector<std::string> search_keys();

// The keys whose values differ, each as "key a against b".
std::vector<std::string> differences(const Layout& a, const Layout& b);

// Keys held fixed (--fix key=value, repeatable); the others are searched.
class Fixes {
public:
    // Parses "key=value"; throws trident::Error naming the option, the key and the problem.
    void add(const std::string& assignment);
    bool allows(const Layout& layout) const;  // every fixed key has its value
    bool empty() const { return held_.empty(); }
    std::string text() const;  // "--fix a=1 --fix b=2", as given
    const std::vector<std::string>& given() const { return given_; }
    // The value held for a key, if any (the enumeration skips what it rules out).
    std::optional<std::string> held(const std::string& key) const;

private:
    std::map<std::string, std::string> held_;  // key -> canonical value
    std::vector<std::string> given_;
};

// What the search enumerates over, besides the config.
struct SearchSpace {
    int gpus = 1;           // N = P·M·C·D
    int gpus_per_node = 8;  // M must divide it, unless cross_node_tensor
    bool cross_node_tensor = false;
    Fixes fixes;
};

// ZeRO's options for one grid: the stage and the shard group.
struct Sharding {
    int zero_stage = 0;
    int data_shard = 0;
};

// Layouts that differ only in their Sharding: everything else of `layout` is theirs.
struct LayoutGroup {
    Layout layout;                    // zero_stage and data_shard unset
    std::vector<Sharding> shardings;  // each a layout that keeps every rule
};

// Why layouts were ruled out: each rule's text and how many (grids, or layouts) it ruled out
// first.
using Rejections = std::map<std::string, int64_t>;

// Calls `visit` with every group of layouts of `space.gpus` GPUs that keep every rule, in a
// fixed order; counts in `rejected` the candidates each rule ruled out first.
void enumerate(const config::Config& base, const SearchSpace& space,
               const std::function<void(const LayoutGroup&)>& visit, Rejections& rejected);

}  // namespace trident::plan
