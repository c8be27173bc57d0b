// Hugging Face tokenizer.json files of byte-level BPE models (GPT-2, Llama 3, Qwen2), read and
// run so that encoding gives the ids the tokenizers library gives.
//
// What is read (anything else in the file is refused at load, with one error naming the key):
//   model          BPE: vocab (token string -> id), merges ("a b" or ["a", "b"]), ignore_merges;
//                  no dropout, byte fallback, subword prefix or word suffix
//   pre_tokenizer  ByteLevel with its own expression (use_regex true), or a Sequence of a Split
//                  on a regular expression (behaviour Isolated, not inverted) and ByteLevel
//                  (use_regex false); add_prefix_space false. The expression must be one of
//                  data/split_patterns.h's.
//   added_tokens   special or not, split out of the text before pre-tokenization (the longest
//                  at the leftmost place; those with normalized false first, as the library
//                  does); lstrip, rstrip and single_word false
//   normalizer     null; truncation and padding null
//   post_processor null, ByteLevel, TemplateProcessing (special tokens around the text of one
//                  sequence, e.g. Llama 3's <|begin_of_text|>) or a Sequence of those
//   decoder        null or ByteLevel
// Token strings spell bytes in GPT-2's mapping (data/byte_level.h); the vocabulary holds ids
// 0..V-1, each byte among them; added tokens have ids of their own vocabulary token, or the
// ids V, V+1, ... in some order.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/bpe.h"
#include "data/split_patterns.h"
#include "data/tokenizer.h"

namespace trident::data {

struct AddedToken {
    int32_t id;
    std::string content;
    bool normalized;  // matched in a second pass, after the tokens with normalized false
};

// A tokenizer.json's contents, checked.
struct HfTokenizerSpec {
    std::vector<std::string> token_bytes;  // (V) the bytes of each vocabulary id
    std::vector<BytePairEncoder::MergeRule> merges;
    bool ignore_merges = false;
    SplitPattern pattern = SplitPattern::gpt2;
    std::vector<AddedToken> added;
    std::vector<int32_t> prefix, suffix;  // the post-processor's ids around a text's
};

// Reads and checks `path`; throws trident::Error naming the file and the cause.
HfTokenizerSpec read_tokenizer_json(const std::string& path);

// The tokenizer of `path`. Its end of text is the added token "<|endoftext|>" (GPT-2, Qwen2),
// else "<|end_of_text|>" (Llama 3), else none.
std::unique_ptr<Tokenizer> make_hf_tokenizer(const std::string& path);

}  // namespace trident::data
