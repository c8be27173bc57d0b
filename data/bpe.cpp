// The byte-pair encoder of data/bpe.h: the merge table, merging a piece's tokens in rank
// order, the per-thread piece cache.
#include "data/bpe.h"

#include <algorithm>
#include <atomic>
#include <climits>

#include "kernels/error.h"

namespace trident::data {

namespace {

// Pieces longer than this are encoded afresh each time: long pieces seldom repeat, and a
// cache entry per piece of a long run of digits or symbols would only fill memory.
constexpr std::size_t kMaxCachedBytes = 64;
// A thread's cache is emptied when it holds this many pieces (about 10 MB), which bounds its
// memory on text with an unbounded vocabulary; the common words come back at once.
constexpr std::size_t kMaxCachedPieces = 1 << 16;

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

}  // namespace

BytePairEncoder::BytePairEncoder(std::vector<std::string> token_bytes,
                                 const std::vector<MergeRule>& merges, bool ignore_merges)
    : token_bytes_(std::move(token_bytes)), instance_(next_instance++) {
    std::fill(std::begin(byte_token_), std::end(byte_token_), -1);
    for (std::size_t id = 0; id < token_bytes_.size(); ++id) {
        const std::string& bytes = token_bytes_[id];
        if (bytes.size() == 1) byte_token_[static_cast<unsigned char>(bytes[0])] = int32_t(id);
        if (ignore_merges) whole_.emplace(bytes, static_cast<int32_t>(id));
    }
    for (int b = 0; b < 256; ++b)
        if (byte_token_[b] < 0) throw Error("no token for the single byte " + std::to_string(b));
    std::size_t slots = 1;
    int bits = 0;
    while (slots < 2 * merges.size()) slots *= 2, ++bits;
    merge_table_.assign(slots, Merge{});
    merge_shift_ = 64 - bits;
    for (std::size_t rank = 0; rank < merges.size(); ++rank) {
        const MergeRule& m = merges[rank];
        insert_merge(Merge{(uint64_t(uint32_t(m.left)) << 32) | uint32_t(m.right),
                           static_cast<int32_t>(rank), m.merged});
    }
}

void BytePairEncoder::insert_merge(const Merge& merge) {
    const std::size_t mask = merge_table_.size() - 1;
    std::size_t slot = merge_slot(merge.pair, merge_shift_);
    while (merge_table_[slot].pair != kNoPair) slot = (slot + 1) & mask;
    merge_table_[slot] = merge;
}

const BytePairEncoder::Merge* BytePairEncoder::find_merge(int32_t left, int32_t right) const {
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
void BytePairEncoder::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
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

void BytePairEncoder::encode(std::string_view piece, std::vector<int32_t>& out) const {
    if (piece.empty()) return;
    if (piece.size() == 1) {
        out.push_back(byte_token_[static_cast<unsigned char>(piece[0])]);
        return;
    }
    if (!whole_.empty()) {
        if (const auto it = whole_.find(piece); it != whole_.end()) {
            out.push_back(it->second);
            return;
        }
    }
    if (piece.size() > kMaxCachedBytes) {
        encode_piece(piece, out);
        return;
    }
    ThreadState& state = thread_state(instance_);
    if (const auto hit = state.cache.find(piece); hit != state.cache.end()) {
        out.insert(out.end(), hit->second.begin(), hit->second.end());
        return;
    }
    const std::size_t first = out.size();
    encode_piece(piece, out);
    if (state.cache.size() >= kMaxCachedPieces) state.cache.clear();
    state.cache.emplace(piece, std::vector<int32_t>(out.begin() + first, out.end()));
}

}  // namespace trident::data
