// GPT-2's byte-level BPE tokenizer (Radford et al. 2019; openai/gpt-2, src/encoder.py): text is
// split into pieces (data/pretokenize.h), each piece's UTF-8 bytes start as one token per byte,
// and adjacent tokens are merged in the order of vocab.bpe's merge list until no listed merge
// applies. It reads OpenAI's two files: encoder.json (token string -> id) and vocab.bpe (the
// merges), fetched by scripts/fetch_gpt2_tokenizer.sh.
//
// Token strings in those files spell bytes with GPT-2's byte-to-unicode mapping (encoder.py's
// bytes_to_unicode): the printable bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for
// themselves, the other 68 bytes, in increasing order, for U+0100, U+0101, ...
//
// Work is on token ids only: a merge is looked up by the pair of ids it joins, and the ids of
// frequent pieces are cached per thread, so encode() needs no lock and may be called from
// several threads on one tokenizer.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace trident::data {

class Gpt2Tokenizer {
public:
    static constexpr int32_t kEndOfText = 50256;  // <|endoftext|>

    // Reads dir/encoder.json and dir/vocab.bpe. Throws trident::Error naming the file (and
    // line or byte) on any problem.
    explicit Gpt2Tokenizer(const std::string& dir);

    // Appends the ids of `text` to `out`. Plain text only: "<|endoftext|>" in `text` is
    // encoded as ordinary characters, as the reference encoders do; append kEndOfText
    // yourself between documents. Any bytes are accepted (see pretokenize.h for invalid UTF-8).
    void encode(std::string_view text, std::vector<int32_t>& out) const;

    // The exact bytes of `ids`. An id outside [0, vocab_size()) is an error.
    std::string decode(std::span<const int32_t> ids) const;

    int vocab_size() const { return static_cast<int>(token_bytes_.size()); }

private:
    // One merge: the pair of ids it joins (left << 32 | right), its place in vocab.bpe (lower
    // merges first) and the id it makes. Kept in an open-addressing table: this lookup is the
    // inner loop of encoding.
    struct Merge {
        uint64_t pair = kNoPair;
        int32_t rank = 0;
        int32_t merged = 0;
    };
    static constexpr uint64_t kNoPair = ~uint64_t{0};

    void insert_merge(const Merge& merge);
    const Merge* find_merge(int32_t left, int32_t right) const;
    void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

    std::vector<std::string> token_bytes_;  // (vocab) the bytes each id stands for
    int32_t byte_token_[256] = {};          // the id of each single byte
    std::vector<Merge> merge_table_;        // power-of-two size, at most half full
    int merge_shift_ = 64;                  // hash >> merge_shift_ is a slot
    uint64_t instance_ = 0;                 // tells the per-thread caches apart
};

// Where the tokenizer files are: $TRIDENT_TOKENIZER_DIR if set; else
// <directory of the running executable>/../data/gpt2 if it holds encoder.json (build/trident
// -> <repo>/data/gpt2); else "data/gpt2".
std::string default_tokenizer_dir();

}  // namespace trident::data
