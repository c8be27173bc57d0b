// GPT-2's byte-level BPE tokenizer of data/gpt2_tokenizer.h: loading and checking OpenAI's
// files, merging a piece's tokens in rank order, the per-thread piece cache, decoding.
#include "data/gpt2_tokenizer.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "data/bpe.h"
#include "data/byte_level.h"
#include "data/pretokenize.h"
#include "io/input_file.h"
#include "io/json_reader.h"
#include "kernels/error.h"

namespace trident::data {

namespace {

namespace fs = std::filesystem;

constexpr const char* kFetchHint = " (scripts/fetch_gpt2_tokenizer.sh fetches the GPT-2 files)";

// GPT-2's encoder.json is 1 MB and vocab.bpe 456 KB.
constexpr uint64_t kMaxTokenizerFileBytes = 64 << 20;

std::string read_file(const std::string& path) {
    try {
        return io::read_regular_file(path, kMaxTokenizerFileBytes, "a tokenizer file");
    } catch (const Error& e) {
        throw Error(e.what() + std::string(kFetchHint));
    }
}

// encoder.json's tokens: the bytes each id stands for, and the id of each token's bytes.
struct Vocabulary {
    std::vector<std::string> token_bytes;  // (vocab)
    std::unordered_map<std::string, int32_t> id_of_bytes;
};

// encoder.json: one object, token string -> id, the ids exactly 0 .. size-1.
Vocabulary read_encoder(const std::string& path) {
    const std::string text = read_file(path);
    io::json::Value root;
    try {
        root = io::json::parse(text);
    } catch (const Error& e) {
        throw Error(path + ": " + e.what() + kFetchHint);
    }
    if (!root.is_object() || root.object.empty())
        throw Error(path + ": expected an object of token strings to ids");
    const std::size_t vocab = root.object.size();
    Vocabulary v;
    v.token_bytes.assign(vocab, std::string());
    for (const io::json::Member& m : root.object) {
        const auto where = [&] { return path + ": token " + io::json::quote(m.key); };
        if (!m.value.is_integer() || m.value.integer < 0 ||
            static_cast<uint64_t>(m.value.integer) >= vocab)
            throw Error(where() + ": expected an id in [0, " + std::to_string(vocab) + ")");
        const auto id = static_cast<int32_t>(m.value.integer);
        if (!v.token_bytes[id].empty())
            throw Error(where() + ": id " + std::to_string(id) + " is used twice");
        try {
            v.token_bytes[id] = byte_level_bytes(m.key);
        } catch (const Error& e) {
            throw Error(path + ": " + e.what());
        }
        if (!v.id_of_bytes.emplace(v.token_bytes[id], id).second)
            throw Error(where() + ": two tokens stand for the same bytes");
    }
    return v;
}

using MergeRule = BytePairEncoder::MergeRule;

// vocab.bpe: a "#version" line, then one merge "LEFT RIGHT" per line, best first; the tokens
// those stand for must be in `vocab`, whose single bytes are `byte_token`.
std::vector<MergeRule> read_merges(const std::string& path, const Vocabulary& vocab,
                                   const int32_t (&byte_token)[256]) {
    const auto& id_of_bytes = vocab.id_of_bytes;
    const std::string text = read_file(path);
    if (!text.starts_with("#version"))
        throw Error(path + ": line 1: expected the \"#version\" header" + kFetchHint);
    std::vector<MergeRule> merges;
    // Merging in rank order one pair at a time (encode_piece) gives encoder.py's result,
    // which merges every occurrence of the best pair at once, only if no merge uses a token
    // made by a later merge. GPT-2's list is built that way (it is the order BPE training
    // made the tokens in); anything else is refused.
    std::vector<int32_t> made_by(vocab.token_bytes.size(), -2);  // -1: a single byte
    for (int b = 0; b < 256; ++b) made_by[byte_token[b]] = -1;
    std::size_t line_start = text.find('\n');
    for (int line = 2; line_start != std::string::npos && line_start + 1 < text.size(); ++line) {
        const std::size_t begin = line_start + 1;
        line_start = text.find('\n', begin);
        const std::string_view entry = std::string_view(text).substr(
            begin, line_start == std::string::npos ? std::string::npos : line_start - begin);
        const auto fail = [&](const std::string& what) {
            throw Error(path + ": line " + std::to_string(line) + ": " + what);
        };
        const std::size_t space = entry.find(' ');
        if (space == std::string_view::npos || space == 0 || space + 1 == entry.size() ||
            entry.find(' ', space + 1) != std::string_view::npos)
            fail("expected two tokens separated by one space");
        std::string left, right;
        try {
            left = byte_level_bytes(entry.substr(0, space));
            right = byte_level_bytes(entry.substr(space + 1));
        } catch (const Error& e) {
            fail(e.what());
        }
        const auto left_id = id_of_bytes.find(left), right_id = id_of_bytes.find(right),
                   merged_id = id_of_bytes.find(left + right);
        if (left_id == id_of_bytes.end() || right_id == id_of_bytes.end() ||
            merged_id == id_of_bytes.end())
            fail("a token of this merge or its result is not in encoder.json");
        const auto rank = static_cast<int32_t>(merges.size());
        if (made_by[left_id->second] == -2 || made_by[right_id->second] == -2)
            fail("uses a token that no earlier merge makes");
        if (made_by[merged_id->second] != -2) fail("makes a token that is already made");
        made_by[merged_id->second] = rank;
        merges.push_back(MergeRule{left_id->second, right_id->second, merged_id->second});
    }
    if (merges.empty()) throw Error(path + ": no merges");
    return merges;
}

// GPT-2's encoder from dir/encoder.json and dir/vocab.bpe.
BytePairEncoder read_gpt2(const std::string& dir) {
    const std::string encoder_path = (fs::path(dir) / "encoder.json").string();
    Vocabulary vocab = read_encoder(encoder_path);
    const auto eot = vocab.id_of_bytes.find("<|endoftext|>");
    if (eot == vocab.id_of_bytes.end() || eot->second != Gpt2Tokenizer::kEndOfText)
        throw Error(encoder_path + ": expected \"<|endoftext|>\" with id " +
                    std::to_string(Gpt2Tokenizer::kEndOfText) + " (GPT-2's vocabulary)");
    int32_t byte_token[256];
    for (int b = 0; b < 256; ++b) {
        const auto it = vocab.id_of_bytes.find(std::string(1, static_cast<char>(b)));
        if (it == vocab.id_of_bytes.end())
            throw Error(encoder_path + ": no token for the single byte " + std::to_string(b));
        byte_token[b] = it->second;
    }
    const std::vector<MergeRule> merges =
        read_merges((fs::path(dir) / "vocab.bpe").string(), vocab, byte_token);
    return BytePairEncoder(std::move(vocab.token_bytes), merges, false);
}

}  // namespace

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& dir) : bpe_(read_gpt2(dir)) {}

void Gpt2Tokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
    for (std::size_t pos = 0; pos < text.size();) {
        const std::size_t end = pretoken_end(text, pos);
        bpe_.encode(text.substr(pos, end - pos), out);
        pos = end;
    }
}

std::string Gpt2Tokenizer::decode(std::span<const int32_t> ids) const {
    std::string text;
    for (const int32_t id : ids) {
        if (id < 0 || id >= vocab_size())
            throw Error("token id " + std::to_string(id) + " is outside GPT-2's vocabulary of " +
                        std::to_string(vocab_size()));
        text += bpe_.token(id);
    }
    return text;
}

std::string default_tokenizer_dir() {
    if (const char* env = std::getenv("TRIDENT_TOKENIZER_DIR"); env && *env) return env;
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) {
        const fs::path beside = (exe.parent_path() / ".." / "data" / "gpt2").lexically_normal();
        if (fs::exists(beside / "encoder.json", ec)) return beside.string();
    }
    return "data/gpt2";
}

}  // namespace trident::data
