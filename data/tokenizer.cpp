// The named tokenizers of tokenizer.h.
#include "data/tokenizer.h"

#include "data/gpt2_tokenizer.h"
#include "data/hf_tokenizer.h"
#include "kernels/error.h"

namespace trident::data {

namespace {

bool printable_ascii(char c) {
    return c > ' ' && c < 0x7f;
}

class ByteTokenizer final : public Tokenizer {
public:
    void encode(std::string_view text, std::vector<int32_t>& out) const override {
        for (char c : text) out.push_back(static_cast<unsigned char>(c));
    }
    std::string decode(std::span<const int32_t> ids) const override {
        std::string text;
        for (int32_t id : ids) {
            if (id < 0 || id > 255)
                throw Error("token id " + std::to_string(id) + " is not a byte (0..255)");
            text += static_cast<char>(id);
        }
        return text;
    }
    int vocab_size() const override { return 256; }
    std::optional<int32_t> end_of_text() const override { return std::nullopt; }
};

class BpeTokenizer final : public Tokenizer {
public:
    BpeTokenizer() : bpe_(default_tokenizer_dir()) {}
    void encode(std::string_view text, std::vector<int32_t>& out) const override {
        bpe_.encode(text, out);
    }
    std::string decode(std::span<const int32_t> ids) const override { return bpe_.decode(ids); }
    int vocab_size() const override { return bpe_.vocab_size(); }
    std::optional<int32_t> end_of_text() const override { return Gpt2Tokenizer::kEndOfText; }

private:
    Gpt2Tokenizer bpe_;
};

}  // namespace

bool Tokenizer::can_cut(std::string_view text, std::size_t pos) const {
    return pos >= 2 && pos < text.size() && text[pos - 1] == '\n' &&
           printable_ascii(text[pos - 2]) && printable_ascii(text[pos]);
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name) {
    if (name == "bytes") return std::make_unique<ByteTokenizer>();
    if (name == "gpt2") return std::make_unique<BpeTokenizer>();
    if (name.ends_with(".json")) return make_hf_tokenizer(name);
    throw Error("unknown tokenizer '" + name +
                "' (available: gpt2, bytes, or the path of a tokenizer.json)");
}

std::unique_ptr<Tokenizer> tokenizer_for_vocab(int vocab_size) {
    return make_tokenizer(vocab_size == 256 ? "bytes" : "gpt2");
}

}  // namespace trident::data
