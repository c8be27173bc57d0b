// Tokenizers by name, behind one small interface, for the commands that turn text into ids
// and back (tokenize, generate, the samples printed after training).
//
// "gpt2": GPT-2's byte-level BPE (data/gpt2_tokenizer.h), vocabulary 50257.
// "bytes": one id per byte, vocabulary 256; no end-of-text token.
// "PATH.json": a Hugging Face tokenizer.json of a byte-level BPE model (data/hf_tokenizer.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace trident::data {

class Tokenizer {
public:
    virtual ~Tokenizer() = default;
    // Appends the ids of `text`; safe to call from several threads at once.
    virtual void encode(std::string_view text, std::vector<int32_t>& out) const = 0;
    virtual std::string decode(std::span<const int32_t> ids) const = 0;
    virtual int vocab_size() const = 0;
    // The id that ends a document, if the vocabulary has one.
    virtual std::optional<int32_t> end_of_text() const = 0;
    // The ids a document starts and ends with before its end of text (a tokenizer.json's
    // post-processor: Llama 3's <|begin_of_text|>); none by default.
    virtual std::span<const int32_t> document_start() const { return {}; }
    virtual std::span<const int32_t> document_end() const { return {}; }
    // Whether encoding text[0, pos) and text[pos, end) separately gives the ids of encoding
    // `text` whole, so that a large document may be encoded in parallel pieces. By default:
    // at a newline between two printable ASCII characters ("x\nY"), where every pre-tokenizer
    // of Trident's ends a piece whatever follows (data/pretokenize.h, data/split_patterns.h).
    virtual bool can_cut(std::string_view text, std::size_t pos) const;
};

// "gpt2" (files from default_tokenizer_dir()), "bytes", or a path ending in ".json"; throws
// trident::Error otherwise.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name);

// The tokenizer a model of this vocabulary was trained with: bytes for 256, else gpt2.
std::unique_ptr<Tokenizer> tokenizer_for_vocab(int vocab_size);

}  // namespace trident::data
