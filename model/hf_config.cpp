// config.json beside Hugging Face GPT-2 weights (see hf_config.h).
#include "model/hf_config.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include "io/json_line.h"
#include "io/json_reader.h"
#include "kernels/error.h"

namespace trident::model {

namespace {

// GPT-2's <|endoftext|>, its bos and eos token, exists only in its own vocabulary.
constexpr int kGpt2Vocab = 50257, kEndOfText = 50256;

}  // namespace

std::string hf_config_path(const std::string& weights) {
    return (std::filesystem::path(weights).parent_path() / "config.json").string();
}

std::string hf_gpt2_config_json(const GptShape& s, double dropout) {
    const std::string architectures[] = {"GPT2LMHeadModel"};
    io::JsonLine c;
    c.add("architectures", std::span<const std::string>(architectures))
        .add("model_type", "gpt2")
        .add("vocab_size", s.vocab)
        .add("n_positions", s.max_seq)
        .add("n_embd", s.hidden)
        .add("n_layer", s.layers)
        .add("n_head", s.heads)
        .add("n_inner", s.ffn)
        .add("activation_function", "gelu_new")
        .add("resid_pdrop", dropout)
        .add("embd_pdrop", dropout)
        .add("attn_pdrop", 0.0)
        .add("layer_norm_epsilon", 1e-5)
        .add("initializer_range", 0.02)
        .add("summary_type", "cls_index")
        .add("summary_use_proj", true)
        .add_null("summary_activation")
        .add("summary_proj_to_labels", true)
        .add("summary_first_dropout", 0.1)
        .add("scale_attn_weights", true)
        .add("use_cache", true);
    if (s.vocab == kGpt2Vocab)
        c.add("bos_token_id", kEndOfText).add("eos_token_id", kEndOfText);
    else
        c.add_null("bos_token_id").add_null("eos_token_id");
    c.add("scale_attn_by_inverse_layer_idx", false).add("reorder_and_upcast_attn", false);
    return c.str() + "\n";
}

io::json::Value read_hf_config_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error("cannot open '" + path + "'");
    const std::string text{std::istreambuf_iterator<char>(in), {}};
    io::json::Value root;
    try {
        root = io::json::parse(text);
    } catch (const Error& e) {
        throw Error(path + ": not JSON: " + e.what());
    }
    if (!root.is_object()) throw Error(path + ": not a JSON object: not a config.json");
    return root;
}

HfGpt2Config read_hf_gpt2_config(const std::string& path) {
    const io::json::Value root = read_hf_config_file(path);
    const io::json::Value* type = root.find("model_type");
    if (type && !(type->is_string() && type->string == "gpt2"))
        throw Error(path + ": model_type is not \"gpt2\": not a Hugging Face GPT-2 config.json");
    const auto integer = [&](const char* key, int absent) {
        const io::json::Value* v = root.find(key);
        if ((!v || v->kind == io::json::Value::Kind::null) && absent > 0) return absent;
        if (!v || !v->is_integer() || v->integer < 1 || v->integer > (1 << 30))
            throw Error(path + ": no positive integer \"" + key +
                        "\": not a Hugging Face GPT-2 config.json");
        return static_cast<int>(v->integer);
    };
    // GPT2Config's defaults for all but the widths, which every GPT-2 config.json states.
    HfGpt2Config c;
    c.hidden = integer("n_embd", 0);
    c.heads = integer("n_head", 0);
    c.vocab = integer("vocab_size", kGpt2Vocab);
    c.max_positions = integer("n_positions", 1024);
    c.layers = integer("n_layer", 12);
    c.ffn = integer("n_inner", 4 * c.hidden);
    return c;
}

}  // namespace trident::model
