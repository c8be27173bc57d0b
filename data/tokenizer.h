// Tokenizers by name, behind one small interface, for the commands that turn text into ids
// and back (tokenize, generate, the samples printed after training).
//
// "gpt2": GPT-2's byte-level BPE (data/gpt2_tokenizer.h), vocabulary 50257.
// "bytes": one id per byte, vocabulary 256; no end-of-text token.
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
};

// "gpt2" (files from default_tokenizer_dir()) or "bytes"; throws trident::Error otherwise.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name);

// The tokenizer a model of this vocabulary was trained with: bytes for 256, else gpt2.
std::unique_ptr<Tokenizer> tokenizer_for_vocab(int vocab_size);

}  // namespace trident::data
