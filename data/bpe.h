// Byte-level byte-pair encoding of one piece of text (Sennrich et al. 2016, over bytes as in
// GPT-2): the piece's bytes start as one token each, and the lowest-ranked merge that applies
// to two adjacent tokens (the leftmost on a tie) is applied until none does. That is the
// tokenizers library's BPE model; for GPT-2's merge list it is also encoder.py's result
// (data/gpt2_tokenizer.cpp says why). With ignore_merges (Llama 3's tokenizer.json sets it),
// a piece that is a token of its own is that token, whatever the merges would make of it.
//
// Work is on token ids only: a merge is looked up by the pair of ids it joins, and the ids of
// frequent pieces are cached per thread, so encode() needs no lock and may be called from
// several threads on one encoder.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace trident::data {

class BytePairEncoder {
public:
    // One merge: the ids it joins and the id it makes. A list of them is best first.
    struct MergeRule {
        int32_t left;
        int32_t right;
        int32_t merged;
    };

    // `token_bytes` (vocab): the bytes each id stands for, each single byte among them.
    // Throws trident::Error (a bare reason) if a byte has no token.
    BytePairEncoder(std::vector<std::string> token_bytes, const std::vector<MergeRule>& merges,
                    bool ignore_merges);
    // whole_ points into token_bytes_: a copy would point into the original.
    BytePairEncoder(const BytePairEncoder&) = delete;
    BytePairEncoder& operator=(const BytePairEncoder&) = delete;
    BytePairEncoder(BytePairEncoder&&) = default;  // the strings stay where they are

    // Appends the ids of `piece` (one piece of a pre-tokenizer) to `out`.
    void encode(std::string_view piece, std::vector<int32_t>& out) const;

    // The bytes of token `id`, 0 <= id < vocab_size().
    const std::string& token(int32_t id) const { return token_bytes_[id]; }
    int vocab_size() const { return static_cast<int>(token_bytes_.size()); }

private:
    // One merge: the pair of ids it joins (left << 32 | right), its rank (lower merges first)
    // and the id it makes. Kept in an open-addressing table: this lookup is the inner loop of
    // encoding.
    struct Merge {
        uint64_t pair = kNoPair;
        int32_t rank = 0;
        int32_t merged = 0;
    };
    static constexpr uint64_t kNoPair = ~uint64_t{0};

    void insert_merge(const Merge& merge);
    const Merge* find_merge(int32_t left, int32_t right) const;
    void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

    std::vector<std::string> token_bytes_;                 // (vocab) the bytes each id stands for
    int32_t byte_token_[256] = {};                         // the id of each single byte
    std::unordered_map<std::string_view, int32_t> whole_;  // ignore_merges: bytes -> id
    std::vector<Merge> merge_table_;                       // power-of-two size, at most half full
    int merge_shift_ = 64;                                 // hash >> merge_shift_ is a slot
    uint64_t instance_ = 0;                                // tells the per-thread caches apart
};

}  // namespace trident::data
