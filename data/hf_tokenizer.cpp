// Encoding and decoding with a tokenizer.json's contents (data/hf_tokenizer.h): added tokens
// split out first, then the pre-tokenizer's pieces, each through byte-pair encoding.
#include "data/hf_tokenizer.h"

#include <array>

#include "kernels/error.h"

namespace trident::data {

namespace {

// The added tokens of one matching pass, found by their first byte.
class AddedMatcher {
public:
    void add(const AddedToken& token) {
        by_first_[static_cast<unsigned char>(token.content[0])].push_back(token);
        ++count_;
    }

    // The leftmost occurrence of a token in `text` at or after `from`, the longest there; its
    // token is null when there is none.
    std::pair<std::size_t, const AddedToken*> find(std::string_view text, std::size_t from) const {
        if (count_ == 0) return {text.size(), nullptr};
        for (std::size_t pos = from; pos < text.size(); ++pos) {
            const AddedToken* best = nullptr;
            for (const AddedToken& t : by_first_[static_cast<unsigned char>(text[pos])])
                if (text.substr(pos).starts_with(t.content) &&
                    (!best || t.content.size() > best->content.size()))
                    best = &t;
            if (best) return {pos, best};
        }
        return {text.size(), nullptr};
    }

private:
    std::array<std::vector<AddedToken>, 256> by_first_;
    std::size_t count_ = 0;
};

class HfTokenizer final : public Tokenizer {
public:
    explicit HfTokenizer(HfTokenizerSpec spec)
        : bpe_(std::move(spec.token_bytes), spec.merges, spec.ignore_merges),
          pattern_(spec.pattern),
          prefix_(std::move(spec.prefix)),
          suffix_(std::move(spec.suffix)) {
        std::size_t vocab = static_cast<std::size_t>(bpe_.vocab_size());
        for (const AddedToken& t : spec.added) vocab = std::max(vocab, std::size_t(t.id) + 1);
        added_bytes_.resize(vocab - static_cast<std::size_t>(bpe_.vocab_size()));
        for (const AddedToken& t : spec.added) {
            (t.normalized ? second_pass_ : first_pass_).add(t);
            if (t.id >= bpe_.vocab_size()) added_bytes_[t.id - bpe_.vocab_size()] = t.content;
            if (t.content.find('\n') != std::string::npos) with_newline_.push_back(t.content);
        }
        for (const char* name : {"<|endoftext|>", "<|end_of_text|>"}) {
            for (const AddedToken& t : spec.added)
                if (!end_of_text_ && t.content == name) end_of_text_ = t.id;
        }
    }

    void encode(std::string_view text, std::vector<int32_t>& out) const override {
        split_added(text, first_pass_, out, [&](std::string_view rest) {
            split_added(rest, second_pass_, out, [&](std::string_view plain) {
                for (std::size_t pos = 0; pos < plain.size();) {
                    const std::size_t end = split_end(pattern_, plain, pos);
                    bpe_.encode(plain.substr(pos, end - pos), out);
                    pos = end;
                }
            });
        });
    }

    std::string decode(std::span<const int32_t> ids) const override {
        std::string text;
        for (const int32_t id : ids) {
            if (id < 0 || id >= vocab_size())
                throw Error("token id " + std::to_string(id) + " is outside the vocabulary of " +
                            std::to_string(vocab_size()));
            text += id < bpe_.vocab_size() ? bpe_.token(id) : added_bytes_[id - bpe_.vocab_size()];
        }
        return text;
    }

    int vocab_size() const override {
        return bpe_.vocab_size() + static_cast<int>(added_bytes_.size());
    }
    std::optional<int32_t> end_of_text() const override { return end_of_text_; }
    std::span<const int32_t> document_start() const override { return prefix_; }
    std::span<const int32_t> document_end() const override { return suffix_; }

    // Besides the pre-tokenizer's rule, no added token may reach across the cut.
    bool can_cut(std::string_view text, std::size_t pos) const override {
        if (!Tokenizer::can_cut(text, pos)) return false;
        for (const std::string& t : with_newline_)
            for (std::size_t k = t.find('\n'); k != std::string::npos; k = t.find('\n', k + 1))
                if (k + 1 < t.size() && k + 1 <= pos && text.substr(pos - k - 1).starts_with(t))
                    return false;
        return true;
    }

private:
    // Sends the added tokens of `matcher` in `text` to `out` and the text between them to
    // `plain`, in order.
    template <typename Plain>
    static void split_added(std::string_view text, const AddedMatcher& matcher,
                            std::vector<int32_t>& out, Plain&& plain) {
        std::size_t pos = 0;
        while (pos < text.size()) {
            const auto [at, token] = matcher.find(text, pos);
            if (at > pos) plain(text.substr(pos, at - pos));
            if (!token) break;
            out.push_back(token->id);
            pos = at + token->content.size();
        }
    }

    BytePairEncoder bpe_;
    SplitPattern pattern_;
    AddedMatcher first_pass_, second_pass_;  // normalized false; normalized true
    std::vector<std::string> added_bytes_;   // the contents of the ids after the vocabulary's
    std::vector<std::string> with_newline_;  // added tokens that hold a newline
    std::vector<int32_t> prefix_, suffix_;
    std::optional<int32_t> end_of_text_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_hf_tokenizer(const std::string& path) {
    HfTokenizerSpec spec = read_tokenizer_json(path);
    try {
        return std::make_unique<HfTokenizer>(std::move(spec));
    } catch (const Error& e) {
        throw Error(path + ": model.vocab: " + e.what());
    }
}

}  // namespace trident::data
