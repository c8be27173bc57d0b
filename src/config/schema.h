// The table of config keys (private to src/config/): one row per key a user can write, saying
// how to read it from YAML, how to write it back and what range it must lie in. Loading,
// validation and to_yaml all walk this one table, so adding a key is adding one row.
#pragma once

#include <yaml-cpp/yaml.h>

#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"
#include "config/values.h"

namespace trident::config::detail {

// One named entry of a key whose value is a map (training.lora's rank, alpha, ...).
struct Part {
    std::string_view name;  // "rank"
    // Parses a YAML value into cfg and checks the part's own range; `at` as in Key::read.
    std::function<Problem(Config&, const YAML::Node&, YAML::Mark& at)> read;
    std::function<std::string(const Config&)> write;  // the value as YAML text (one line)
};

struct Key {
    std::string_view path;  // "training.lr"; a key outside any section has no dot ("device")
    bool required = false;  // must be given (no usable default)
    // Parses a YAML value into cfg. A problem inside a value of several parts (an item of a
    // list) may set `at` to that part's place, so that the message points at its line.
    // Null for a key with parts: load.cpp reads its map part by part.
    std::function<Problem(Config&, const YAML::Node&, YAML::Mark& at)> read = nullptr;
    std::function<std::string(const Config&)> write;    // the value as YAML text (one line)
    std::function<Problem(const Config&)> check_range;  // the value's own limits

    // A key whose value is a map of parts: null or a map in which each part is optional.
    // Setting the map first resets every part to its default (`reset`), then reads the parts
    // given; --set PATH.PART=value sets one part alone. Problems name the part's path
    // ("training.lora.rank").
    std::vector<Part> parts = {};
    std::function<void(Config&)> reset = nullptr;

    // An old spelling still read (load.cpp maps it onto its successor and warns) but never
    // written back: to_yaml leaves it out.
    bool deprecated = false;
};

// Every key, in the order to_yaml writes them (section by section).
std::span<const Key> keys();

// The key with this exact path, or null.
const Key* find_key(std::string_view path);

// The part of `key` with this name, or null.
const Part* find_part(const Key& key, std::string_view name);

// The section names ("model", "parallel", ...) in table order.
std::vector<std::string> sections();

// The section part of a path ("training" for "training.lr"; "" for "device") and the rest.
std::string_view section_of(std::string_view path);
std::string_view leaf_of(std::string_view path);

// Where each key's value came from, so that an error can point at the line (or override) that
// set it. Keys left at their default point at the file as a whole.
class Origins {
public:
    explicit Origins(std::string file) : file_(std::move(file)) {}

    // `rank` orders the sources: 1 for the file, 2, 3, ... for overrides in the order applied.
    void set(std::string_view path, std::string where, int rank);
    bool is_set(std::string_view path) const;
    // The rank of the source that set `path` last; 0 where nothing set it.
    int rank(std::string_view path) const;
    const std::string& file() const { return file_; }

    // Where to point for a problem with `path`: "configs/x.yaml:12", "--set a.b=1" or the file.
    std::string where(std::string_view path) const;

    // Where to point for a problem involving several keys: the one set last (an override
    // beats the file); among keys set by the file, the first listed (the one at fault).
    std::string blame(std::initializer_list<std::string_view> paths) const;

private:
    struct Origin {
        std::string where;
        int rank = 0;
    };
    std::string file_;
    std::map<std::string, Origin, std::less<>> by_path_;
};

// model.init_from naming a Hugging Face folder (one holding config.json): the shape keys not
// given are taken from its config.json, and those given must agree with it (hf_folder.cpp).
void take_hf_config(Config& cfg, Origins& origins);

// Checks the required keys (those of the data section only for Purpose::train, the one that
// reads data), each key's range, then the keys against each other, and (but for Purpose::plan)
// refuses what this build cannot run yet. Throws ConfigError pointing at the key at fault.
void validate(const Config& cfg, const Origins& origins, Purpose purpose);

}  // namespace trident::config::detail
