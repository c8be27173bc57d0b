// A Hugging Face folder's eos token from tokenizer_config.json (see hf_eos_token.h).
#include "model/hf_eos_token.h"

#include <charconv>
#include <filesystem>

#include "io/json_reader.h"
#include "kernels/error.h"
#include "model/hf_config.h"

namespace trident::model {

namespace {

using io::json::Value;
namespace fs = std::filesystem;

// The "content" of `token`: a string, or an AddedToken's object; "" for any other value.
std::string content_of(const Value* token) {
    if (token && token->is_string()) return token->string;
    const Value* content = token && token->is_object() ? token->find("content") : nullptr;
    return content && content->is_string() ? content->string : "";
}

// The id whose added token is `text` in added_tokens_decoder ({"id": {"content": ...}}), or -1.
int decoder_id(const Value& tokenizer_config, const std::string& text) {
    const Value* decoder = tokenizer_config.find("added_tokens_decoder");
    if (!decoder || !decoder->is_object()) return -1;
    for (const io::json::Member& m : decoder->object) {
        int id = -1;
        const auto [end, ec] = std::from_chars(m.key.data(), m.key.data() + m.key.size(), id);
        if (ec == std::errc() && end == m.key.data() + m.key.size() && content_of(&m.value) == text)
            return id;
    }
    return -1;
}

// The id of `text` in tokenizer.json: its added_tokens ([{"id", "content"}]), else its model's
// vocab ({"text": id}); -1 where neither has it.
int tokenizer_json_id(const Value& tokenizer, const std::string& text) {
    if (const Value* added = tokenizer.find("added_tokens"); added && added->is_array())
        for (const Value& token : added->array)
            if (const Value* id = token.is_object() ? token.find("id") : nullptr;
                id && id->is_integer() && content_of(&token) == text)
                return static_cast<int>(id->integer);
    const Value* model = tokenizer.find("model");
    const Value* vocab = model && model->is_object() ? model->find("vocab") : nullptr;
    const Value* id = vocab && vocab->is_object() ? vocab->find(text) : nullptr;
    return id && id->is_integer() ? static_cast<int>(id->integer) : -1;
}

}  // namespace

int read_hf_eos_token(const std::string& dir) {
    const std::string path = (fs::path(dir) / "tokenizer_config.json").string();
    std::error_code error;
    if (!fs::exists(path, error)) return -1;
    const Value root = read_hf_config_file(path);
    if (const Value* id = root.find("eos_token_id"); id && id->is_integer() && id->integer >= 0)
        return static_cast<int>(id->integer);
    const std::string text = content_of(root.find("eos_token"));
    if (text.empty()) return -1;
    if (const int id = decoder_id(root, text); id >= 0) return id;
    const std::string tokenizer = (fs::path(dir) / "tokenizer.json").string();
    const int id =
        fs::exists(tokenizer, error) ? tokenizer_json_id(read_hf_config_file(tokenizer), text) : -1;
    if (id < 0)
        throw Error(path + ": eos_token \"" + text + "\" has no id in its added_tokens_decoder " +
                    "nor in " + tokenizer);
    return id;
}

}  // namespace trident::model
