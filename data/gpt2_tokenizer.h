// GPT-2's byte-level BPE tokenizer (Radford et al. 2019; openai/gpt-2, src/encoder.py): text is
// split into pieces (data/pretokenize.h), each piece's UTF-8 bytes start as one token per byte,
// and adjacent tokens are merged in the order of vocab.bpe's merge list until no listed merge
// applies. It reads OpenAI's two files: encoder.json (token string -> id) and vocab.bpe (the
// merges), fetched by scripts/fetch_gpt2_tokenizer.sh.
//
// Token strings in those files spell bytes with GPT-2's byte-to-unicode mapping
// (data/byte_level.h). The merging itself is data/bpe.h's.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/bpe.h"

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

    int vocab_size() const { return bpe_.vocab_size(); }

private:
    BytePairEncoder bpe_;
};

// Where the tokenizer files are: $TRIDENT_TOKENIZER_DIR if set; else
// <directory of the running executable>/../data/gpt2 if it holds encoder.json (build/trident
// -> <repo>/data/gpt2); else "data/gpt2".
std::string default_tokenizer_dir();

}  // namespace trident::data
