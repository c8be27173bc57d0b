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

#include "data/pretokenize.h"
#include "io/input_file.h"
#include "io/json_reader.h"
#include "kernels/error.h"

namespace trident::data {

namespace {

namespace fs = std::filesystem;

constexpr const char* kFetchHint = " (scripts/fetch_gpt2_tokenizer.sh fetches the GPT-2 files)";

// Pieces longer than this are encoded afresh each time: long pieces seldom repeat, and a
// cache entry per piece of a long run of digits or symbols would only fill memory.
constexpr std::size_t kMaxCachedBytes = 64;
// A thread's cache is emptied when it holds this many pieces (about 10 MB), which bounds its
// memory on text with an unbounded vocabulary; the common words come back at once.
constexpr std::size_t kMaxCachedPieces = 1 << 16;

// encoder.py's bytes_to_unicode(), inverted: the byte each code point below 324 stands for,
// or -1 for code points that stand for none.
std::array<int, 324> unicode_to_byte() {
    std::array<int, 324> byte_of{};
    byte_of.fill(-1);
    const auto printable = [](int b) {
        return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int next = 256;
    for (int b = 0; b < 256; ++b) byte_of[printable(b) ? b : next++] = b;
    return byte_of;
}

// GPT-2's encoder.json is 1 MB and vocab.bpe 456 KB.
constexpr uint64_t kMaxTokenizerFileBytes = 64 << 20;

std::string read_file(const std::string& path) {
    try {
        return io::read_regular_file(path, kMaxTokenizerFileBytes, "a tokenizer file");
    } catch (const Error& e) {
        throw Error(e.what() + std::string(kFetchHint));
    }
}

// The bytes a token string of encoder.json or vocab.bpe stands for; throws a bare reason.
std::string token_string_bytes(std::string_view token, const std::array<int, 324>& byte_of) {
    std::string bytes;
    for (std::size_t pos = 0; pos < token.size();) {
        char32_t code = 0;
        const int length = utf8_sequence(token, pos, code);
        if (length == 0) throw Error("invalid UTF-8 in token " + io::json::quote(token));
        if (code >= byte_of.size() || byte_of[code] < 0)
            throw Error("token " + io::json::quote(token) +
                        " has a character that stands for no byte in GPT-2's mapping");
        bytes += static_cast<char>(byte_of[code]);
        pos += static_cast<std::size_t>(length);
    }
    if (bytes.empty()) throw Error("empty token");
    return bytes;
}

// What encode() keeps per thread: the ids of pieces seen before and scratch space for
// merging, so encoding a piece allocates nothing once warm.
struct ThreadState {
    struct Hash {
        using is_transparent = void;
        std::size_t operator()(std::string_view s) const {
            return std::hash<std::string_view>{}(s);
        }
    };
    uint64_t instance = 0;  // the tokenizer whose ids `cache` holds
    std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> cache;

    struct Symbol {
        int32_t id;    // -1 once merged into the symbol on its left
        int32_t next;  // index of the next live symbol, -1 at the end
        int32_t prev;  // index of the previous live symbol, -1 at the start
    };
    // A merge that may apply: symbol `left` (with id left_id) and the next (with right_id)
    // make `merged`.
    struct Candidate {
        int32_t rank;
        int32_t left;
        int32_t left_id;
        int32_t right_id;
        int32_t merged;
        // std heaps are max-heaps: "greater" here makes the top the lowest rank, leftmost.
        bool operator<(const Candidate& o) const {
            return rank != o.rank ? rank > o.rank : left > o.left;
        }
    };
    std::vector<Symbol> symbols;
    std::vector<Candidate> heap;
};

ThreadState& thread_state(uint64_t instance) {
    thread_local ThreadState state;
    if (state.instance != instance) {
        state.cache.clear();
        state.instance = instance;
    }
    return state;
}

std::atomic<uint64_t> next_instance{1};

// Fibonacci hashing: the multiply spreads the two packed ids over the top bits.
std::size_t merge_slot(uint64_t pair, int shift) {
    return static_cast<std::size_t>((pair * 0x9E3779B97F4A7C15ull) >> shift);
}

// encoder.json's tokens: the bytes each id stands for, and the id of each token's bytes.
struct Vocabulary {
    std::vector<std::string> token_bytes;  // (vocab)
    std::unordered_map<std::string, int32_t> id_of_bytes;
};

// encoder.json: one object, token string -> id, the ids exactly 0 .. size-1.
Vocabulary read_encoder(const std::string& path, const std::array<int, 324>& byte_of) {
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
            v.token_bytes[id] = token_string_bytes(m.key, byte_of);
        } catch (const Error& e) {
            throw Error(path + ": " + e.what());
        }
        if (!v.id_of_bytes.emplace(v.token_bytes[id], id).second)
            throw Error(where() + ": two tokens stand for the same bytes");
    }
    return v;
}

// One line of vocab.bpe as the tokenizer keeps it (Gpt2Tokenizer::Merge).
struct MergeRule {
    uint64_t pair;  // left id << 32 | right id
    int32_t rank;
    int32_t merged;
};

// vocab.bpe: a "#version" line, then one merge "LEFT RIGHT" per line, best first; the tokens
// those stand for must be in `vocab`, whose single bytes are `byte_token`.
std::vector<MergeRule> read_merges(const std::string& path, const Vocabulary& vocab,
                                   const int32_t (&byte_token)[256],
                                   const std::array<int, 324>& byte_of) {
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
            left = token_string_bytes(entry.substr(0, space), byte_of);
            right = token_string_bytes(entry.substr(space + 1), byte_of);
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
        merges.push_back(
            MergeRule{(uint64_t(uint32_t(left_id->second)) << 32) | uint32_t(right_id->second),
                      rank, merged_id->second});
    }
    if (merges.empty()) throw Error(path + ": no merges");
    return merges;
}

}  // namespace

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& dir) : instance_(next_instance++) {
    const std::array<int, 324> byte_of = unicode_to_byte();

    const std::string encoder_path = (fs::path(dir) / "encoder.json").string();
    Vocabulary vocab = read_encoder(encoder_path, byte_of);
    const auto eot = vocab.id_of_bytes.find("<|endoftext|>");
    if (eot == vocab.id_of_bytes.end() || eot->second != kEndOfText)
        throw Error(encoder_path + ": expected \"<|endoftext|>\" with id " +
                    std::to_string(kEndOfText) + " (GPT-2's vocabulary)");
    for (int b = 0; b < 256; ++b) {
        const auto it = vocab.id_of_bytes.find(std::string(1, static_cast<char>(b)));
        if (it == vocab.id_of_bytes.end())
            throw Error(encoder_path + ": no token for the single byte " + std::to_string(b));
        byte_token_[b] = it->second;
    }

    const std::vector<MergeRule> merges =
        read_merges((fs::path(dir) / "vocab.bpe").string(), vocab, byte_token_, byte_of);
    token_bytes_ = std::move(vocab.token_bytes);
    std::size_t slots = 1;
    int bits = 0;
    while (slots < 2 * merges.size()) slots *= 2, ++bits;
    merge_table_.assign(slots, Merge{});
    merge_shift_ = 64 - bits;
    for (const MergeRule& m : merges) insert_merge(Merge{m.pair, m.rank, m.merged});
}

void Gpt2Tokenizer::insert_merge(const Merge& merge) {
    const std::size_t mask = merge_table_.size() - 1;
    std::size_t slot = merge_slot(merge.pair, merge_shift_);
    while (merge_table_[slot].pair != kNoPair) slot = (slot + 1) & mask;
    merge_table_[slot] = merge;
}

const Gpt2Tokenizer::Merge* Gpt2Tokenizer::find_merge(int32_t left, int32_t right) const {
    const uint64_t pair = (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
    const std::size_t mask = merge_table_.size() - 1;
    for (std::size_t slot = merge_slot(pair, merge_shift_);; slot = (slot + 1) & mask) {
        const Merge& m = merge_table_[slot];
        if (m.pair == pair) return &m;
        if (m.pair == kNoPair) return nullptr;
    }
}

// BPE of one piece: start from one symbol per byte and apply the lowest-ranked applicable
// merge (the leftmost on a tie) until none applies. Candidates wait in a heap and are checked
// when taken, since a merge beside them may have changed their symbols: O(n log n) in the
// piece's length, where rescanning all pairs per merge would be quadratic on long pieces.
void Gpt2Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
    ThreadState& state = thread_state(instance_);
    auto& symbols = state.symbols;
    auto& heap = state.heap;
    if (piece.size() > INT32_MAX)
        throw Error("cannot tokenize a run of over 2 GiB without a space or a change of script");
    const auto n = static_cast<int32_t>(piece.size());
    symbols.resize(piece.size());
    for (int32_t i = 0; i < n; ++i)
        symbols[i] = {byte_token_[static_cast<unsigned char>(piece[i])], i + 1 < n ? i + 1 : -1,
                      i - 1};
    heap.clear();
    const auto consider = [&](int32_t left) {
        const int32_t right = symbols[left].next;
        if (right < 0) return;
        if (const Merge* m = find_merge(symbols[left].id, symbols[right].id)) {
            heap.push_back({m->rank, left, symbols[left].id, symbols[right].id, m->merged});
            std::push_heap(heap.begin(), heap.end());
        }
    };
    for (int32_t i = 0; i + 1 < n; ++i) consider(i);
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end());
        const ThreadState::Candidate c = heap.back();
        heap.pop_back();
        ThreadState::Symbol& left = symbols[c.left];
        if (left.id != c.left_id || left.next < 0 || symbols[left.next].id != c.right_id)
            continue;  // stale: one of its symbols has been merged since
        ThreadState::Symbol& right = symbols[left.next];
        left.id = c.merged;
        right.id = -1;
        left.next = right.next;
        if (right.next >= 0) symbols[right.next].prev = c.left;
        if (left.prev >= 0) consider(left.prev);
        consider(c.left);
    }
    for (int32_t i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

void Gpt2Tokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
    ThreadState& state = thread_state(instance_);
    for (std::size_t pos = 0; pos < text.size();) {
        const std::size_t end = pretoken_end(text, pos);
        const std::string_view piece = text.substr(pos, end - pos);
        pos = end;
        if (piece.size() == 1) {
            out.push_back(byte_token_[static_cast<unsigned char>(piece[0])]);
            continue;
        }
        if (piece.size() > kMaxCachedBytes) {
            encode_piece(piece, out);
            continue;
        }
        if (const auto hit = state.cache.find(piece); hit != state.cache.end()) {
            out.insert(out.end(), hit->second.begin(), hit->second.end());
            continue;
        }
        const std::size_t first = out.size();
        encode_piece(piece, out);
        if (state.cache.size() >= kMaxCachedPieces) state.cache.clear();
        state.cache.emplace(piece, std::vector<int32_t>(out.begin() + first, out.end()));
    }
}

std::string Gpt2Tokenizer::decode(std::span<const int32_t> ids) const {
    std::string text;
    for (const int32_t id : ids) {
        if (id < 0 || id >= vocab_size())
            throw Error("token id " + std::to_string(id) + " is outside GPT-2's vocabulary of " +
                        std::to_string(vocab_size()));
        text += token_bytes_[id];
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
