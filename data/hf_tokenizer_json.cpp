// Reading a tokenizer.json (data/hf_tokenizer.h): every part the tokenizers library would act
// on is either understood exactly or refused with the key that holds it.
#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "data/byte_level.h"
#include "data/hf_tokenizer.h"
#include "io/input_file.h"
#include "io/json_reader.h"
#include "kernels/error.h"

namespace trident::data {

namespace {

using io::json::Value;

// Llama 3's tokenizer.json is 9 MB, Qwen2's 7 MB.
constexpr uint64_t kMaxFileBytes = 256 << 20;

// A bare reason, which read_tokenizer_json prefixes with the file.
[[noreturn]] void refuse(const std::string& key, const std::string& what) {
    throw Error(key + ": " + what);
}

const Value& member(const Value& object, const std::string& key, const std::string& where) {
    const Value* v = object.is_object() ? object.find(key) : nullptr;
    if (!v) refuse(where, "expected an object with \"" + key + "\"");
    return *v;
}

bool is_null(const Value* v) {
    return !v || v->kind == Value::Kind::null;
}

std::string string_of(const Value& object, const std::string& key, const std::string& where) {
    const Value& v = member(object, key, where);
    if (!v.is_string()) refuse(where + "." + key, "expected a string");
    return v.string;
}

// A boolean flag that may be left out (then `fallback`); `wanted`, if given, is the only value
// supported.
bool flag(const Value& object, const std::string& key, const std::string& where, bool fallback,
          std::optional<bool> wanted = std::nullopt) {
    const Value* v = object.find(key);
    if (is_null(v)) return fallback;
    if (v->kind != Value::Kind::boolean) refuse(where + "." + key, "expected true or false");
    if (wanted && v->boolean != *wanted)
        refuse(where + "." + key, std::string(v->boolean ? "true" : "false") +
                                      " is not supported (only " + (*wanted ? "true" : "false") +
                                      ")");
    return v->boolean;
}

int32_t id_of(const Value& v, const std::string& where) {
    if (!v.is_integer() || v.integer < 0 || v.integer > INT32_MAX)
        refuse(where, "expected an id (a non-negative integer)");
    return static_cast<int32_t>(v.integer);
}

// ByteLevel's flags: add_prefix_space must be false; use_regex is returned. trim_offsets only
// moves offsets, which Trident does not report.
bool byte_level_regex(const Value& p, const std::string& where) {
    flag(p, "add_prefix_space", where, true, false);
    flag(p, "trim_offsets", where, true);
    return flag(p, "use_regex", where, true);
}

SplitPattern read_split(const Value& p, const std::string& where) {
    const Value& pattern = member(p, "pattern", where);
    const Value* regex = pattern.is_object() ? pattern.find("Regex") : nullptr;
    if (!regex || !regex->is_string())
        refuse(where + ".pattern", "expected {\"Regex\": ...} (a String pattern is not supported)");
    const auto known = recognise_pattern(regex->string);
    if (!known)
        refuse(where + ".pattern",
               "the expression " + io::json::quote(regex->string) +
                   " is not one Trident runs; it runs these:" + known_patterns());
    if (const std::string b = string_of(p, "behavior", where); b != "Isolated")
        refuse(where + ".behavior", "\"" + b + "\" is not supported (only \"Isolated\")");
    flag(p, "invert", where, false, false);
    return *known;
}

SplitPattern read_pre_tokenizer(const Value& root) {
    const Value& p = member(root, "pre_tokenizer", "the file");
    const std::string type = string_of(p, "type", "pre_tokenizer");
    if (type == "ByteLevel") {
        if (!byte_level_regex(p, "pre_tokenizer"))
            refuse("pre_tokenizer.use_regex", "false with no Split before it is not supported");
        return SplitPattern::gpt2;
    }
    const Value* steps = type == "Sequence" ? p.find("pretokenizers") : nullptr;
    if (!steps || !steps->is_array() || steps->array.size() != 2)
        refuse("pre_tokenizer", "\"" + type + "\" is not supported (only ByteLevel, or a " +
                                    "Sequence of Split and ByteLevel)");
    const std::string first = "pre_tokenizer.pretokenizers[0]";
    const std::string second = "pre_tokenizer.pretokenizers[1]";
    if (string_of(steps->array[0], "type", first) != "Split")
        refuse(first + ".type", "expected \"Split\"");
    if (string_of(steps->array[1], "type", second) != "ByteLevel")
        refuse(second + ".type", "expected \"ByteLevel\"");
    if (byte_level_regex(steps->array[1], second))
        refuse(second + ".use_regex", "true after a Split is not supported (only false)");
    return read_split(steps->array[0], first);
}

// One "merges" entry: "a b" or ["a", "b"].
std::pair<std::string, std::string> merge_pair(const Value& m, const std::string& where) {
    if (m.is_string()) {
        const std::size_t space = m.string.find(' ');
        if (space == std::string::npos || m.string.find(' ', space + 1) != std::string::npos)
            refuse(where, "expected two tokens separated by one space");
        return {m.string.substr(0, space), m.string.substr(space + 1)};
    }
    if (!m.is_array() || m.array.size() != 2 || !m.array[0].is_string() || !m.array[1].is_string())
        refuse(where, "expected \"a b\" or [\"a\", \"b\"]");
    return {m.array[0].string, m.array[1].string};
}

void check_bpe_options(const Value& model) {
    if (const std::string type = string_of(model, "type", "model"); type != "BPE")
        refuse("model.type", "\"" + type + "\" is not supported (only BPE)");
    if (!is_null(model.find("dropout"))) refuse("model.dropout", "only null is supported");
    flag(model, "byte_fallback", "model", false, false);
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
        const Value* v = model.find(key);
        if (!is_null(v) && !(v->is_string() && v->string.empty()))
            refuse(std::string("model.") + key, "only null is supported");
    }
}

// model: the vocabulary (ids 0..V-1) and the merges.
void read_model(const Value& root, HfTokenizerSpec& spec,
                std::unordered_map<std::string, int32_t>& id_of_token) {
    const Value& model = member(root, "model", "the file");
    check_bpe_options(model);
    spec.ignore_merges = flag(model, "ignore_merges", "model", false);
    const Value& vocab = member(model, "vocab", "model");
    if (!vocab.is_object() || vocab.object.empty())
        refuse("model.vocab", "expected an object of token strings to ids");
    spec.token_bytes.assign(vocab.object.size(), std::string());
    for (const io::json::Member& m : vocab.object) {
        const std::string where = "model.vocab." + io::json::quote(m.key);
        const int32_t id = id_of(m.value, where);
        if (static_cast<std::size_t>(id) >= vocab.object.size())
            refuse(where, "id " + std::to_string(id) + " is not below the vocabulary's size " +
                              std::to_string(vocab.object.size()));
        if (!spec.token_bytes[id].empty())
            refuse(where, "id " + std::to_string(id) + " is used twice");
        try {
            spec.token_bytes[id] = byte_level_bytes(m.key);
        } catch (const Error& e) {
            refuse(where, e.what());
        }
        id_of_token.emplace(m.key, id);
    }
    const Value& merges = member(model, "merges", "model");
    if (!merges.is_array()) refuse("model.merges", "expected an array");
    // A pair listed twice has no one rank (which one a table keeps is an accident of how it is
    // built): refused.
    std::unordered_set<uint64_t> pairs;
    for (std::size_t i = 0; i < merges.array.size(); ++i) {
        const std::string where = "model.merges[" + std::to_string(i) + "]";
        const auto [left, right] = merge_pair(merges.array[i], where);
        const auto l = id_of_token.find(left), r = id_of_token.find(right),
                   made = id_of_token.find(left + right);
        if (l == id_of_token.end() || r == id_of_token.end() || made == id_of_token.end())
            refuse(where, "a token of this merge or its result is not in the vocabulary");
        if (!pairs.insert(uint64_t(uint32_t(l->second)) << 32 | uint32_t(r->second)).second)
            refuse(where, "this merge is listed twice");
        spec.merges.push_back({l->second, r->second, made->second});
    }
}

// added_tokens: each either the vocabulary's token of its id (GPT-2's <|endoftext|>) or a new
// one, the new ones taking the ids V, V+1, ... in the file's order (the order in which the
// library gives them ids).
void read_added_tokens(const Value& root, HfTokenizerSpec& spec,
                       const std::unordered_map<std::string, int32_t>& id_of_token) {
    const Value* list = root.find("added_tokens");
    if (is_null(list)) return;
    if (!list->is_array()) refuse("added_tokens", "expected an array");
    auto next_id = static_cast<int32_t>(spec.token_bytes.size());
    for (std::size_t i = 0; i < list->array.size(); ++i) {
        const Value& t = list->array[i];
        const std::string where = "added_tokens[" + std::to_string(i) + "]";
        const int32_t id = id_of(member(t, "id", where), where + ".id");
        const std::string content = string_of(t, "content", where);
        if (content.empty()) refuse(where + ".content", "an empty token is not supported");
        for (const char* key : {"lstrip", "rstrip", "single_word"})
            flag(t, key, where, false, false);
        const bool special = flag(t, "special", where, false);
        const bool normalized = flag(t, "normalized", where, !special);
        const auto in_vocab = id_of_token.find(content);
        if (in_vocab != id_of_token.end() && in_vocab->second != id)
            refuse(where, io::json::quote(content) + " is the vocabulary's token " +
                              std::to_string(in_vocab->second) + ", not " + std::to_string(id));
        if (in_vocab == id_of_token.end() && id != next_id++)
            refuse(where + ".id", "expected " + std::to_string(next_id - 1) +
                                      ": new tokens take the ids after the vocabulary's in order");
        for (const AddedToken& other : spec.added)
            if (other.content == content)
                refuse(where, io::json::quote(content) + " is added twice");
        spec.added.push_back({id, content, normalized});
    }
}

// One TemplateProcessing: the special tokens before and after the sequence $A ("single").
void read_template(const Value& p, const std::string& where, HfTokenizerSpec& spec) {
    const Value& single = member(p, "single", where);
    const Value& specials = member(p, "special_tokens", where);
    if (!single.is_array()) refuse(where + ".single", "expected an array");
    bool seen_sequence = false;
    for (std::size_t i = 0; i < single.array.size(); ++i) {
        const Value& piece = single.array[i];
        const std::string at = where + ".single[" + std::to_string(i) + "]";
        if (const Value* s = piece.is_object() ? piece.find("SpecialToken") : nullptr) {
            const std::string name = string_of(*s, "id", at + ".SpecialToken");
            const Value& ids = member(member(specials, name, where + ".special_tokens"), "ids",
                                      where + ".special_tokens." + name);
            if (!ids.is_array()) refuse(where + ".special_tokens." + name, "expected ids");
            for (const Value& id : ids.array)
                (seen_sequence ? spec.suffix : spec.prefix).push_back(id_of(id, at));
        } else if (const Value* q = piece.is_object() ? piece.find("Sequence") : nullptr) {
            if (string_of(*q, "id", at + ".Sequence") != "A" || seen_sequence)
                refuse(at, "expected one sequence, A");
            seen_sequence = true;
        } else {
            refuse(at, "expected a SpecialToken or a Sequence");
        }
    }
    if (!seen_sequence) refuse(where + ".single", "expected the sequence A");
}

// post_processor: null, ByteLevel (it only moves offsets), TemplateProcessing, or a Sequence.
void read_post_processor(const Value& root, HfTokenizerSpec& spec) {
    const Value* p = root.find("post_processor");
    if (is_null(p)) return;
    std::vector<std::pair<const Value*, std::string>> steps{{p, "post_processor"}};
    if (string_of(*p, "type", "post_processor") == "Sequence") {
        const Value& list = member(*p, "processors", "post_processor");
        if (!list.is_array()) refuse("post_processor.processors", "expected an array");
        steps.clear();
        for (std::size_t i = 0; i < list.array.size(); ++i)
            steps.push_back(
                {&list.array[i], "post_processor.processors[" + std::to_string(i) + "]"});
    }
    int templates = 0;
    for (const auto& [step, where] : steps) {
        const std::string type = string_of(*step, "type", where);
        if (type == "TemplateProcessing" && templates++ == 0)
            read_template(*step, where, spec);
        else if (type != "ByteLevel")
            refuse(where + ".type", "\"" + type + "\" is not supported (only ByteLevel and one " +
                                        "TemplateProcessing)");
    }
    std::size_t vocab = spec.token_bytes.size();
    for (const AddedToken& t : spec.added) vocab = std::max(vocab, std::size_t(t.id) + 1);
    for (const auto* ids : {&spec.prefix, &spec.suffix})
        for (const int32_t id : *ids)
            if (static_cast<std::size_t>(id) >= vocab)
                refuse("post_processor", "id " + std::to_string(id) + " has no token");
}

// The parts that must be absent: they would change the text or the ids.
void check_unsupported(const Value& root) {
    for (const char* key : {"normalizer", "truncation", "padding"})
        if (!is_null(root.find(key))) refuse(key, "only null is supported");
    const Value* decoder = root.find("decoder");
    if (!is_null(decoder) && string_of(*decoder, "type", "decoder") != "ByteLevel")
        refuse("decoder.type", "only ByteLevel is supported");
}

}  // namespace

HfTokenizerSpec read_tokenizer_json(const std::string& path) {
    const std::string text = io::read_regular_file(path, kMaxFileBytes, "a tokenizer.json");
    try {
        const Value root = io::json::parse(text);
        if (!root.is_object()) refuse("the file", "expected a JSON object");
        HfTokenizerSpec spec;
        std::unordered_map<std::string, int32_t> id_of_token;
        read_model(root, spec, id_of_token);
        spec.pattern = read_pre_tokenizer(root);
        read_added_tokens(root, spec, id_of_token);
        read_post_processor(root, spec);
        check_unsupported(root);
        return spec;
    } catch (const Error& e) {
        throw Error(path + ": " + e.what());
    }
}

}  // namespace trident::data
