// Hugging Face Llama config.json, read and written (see hf_llama_config.h).
#include "model/hf_llama_config.h"

#include <cmath>
#include <span>

#include "io/json_line.h"
#include "kernels/error.h"
#include "model/hf_config.h"
#include "model/hf_config_fields.h"

namespace trident::model {

namespace {

using io::json::Value;
using Fields = HfFields;

// Another model_type, named with why it is not our llama.
[[noreturn]] void refuse_model_type(const std::string& path, const std::string& type) {
    std::string why =
        "only model_type \"llama\", \"qwen3\", \"mixtral\" and \"qwen3_moe\" (LlamaForCausalLM, "
        "Qwen3ForCausalLM, MixtralForCausalLM, Qwen3MoeForCausalLM) folders are read";
    if (type == "qwen2") why = "Qwen2 has attention biases, which Trident's llama has not; " + why;
    if (type == "mistral") why = "Mistral's sliding-window attention is not Trident's; " + why;
    throw Error(path + ": model_type \"" + type + "\": " + why);
}

// The features of LlamaConfig that Trident's llama does not have, one message each.
void refuse_features(const Fields& f) {
    if (f.find("rope_scaling")) f.refuse("rope_scaling is set (scaled rotary positions)");
    if (f.flag("attention_bias", false)) f.refuse("attention_bias is true (q, k, v, o biases)");
    if (f.flag("mlp_bias", false)) f.refuse("mlp_bias is true (gate, up, down biases)");
    const std::string act = f.text("hidden_act", "silu");
    if (act != "silu") f.refuse("hidden_act is \"" + act + "\" (Trident's SwiGLU uses silu)");
}

// head_dim where it differs from hidden_size / num_attention_heads (0 where it does not); with
// none given, the heads must divide hidden_size.
int head_dim(const Fields& f, int hidden, int heads) {
    if (!f.find("head_dim")) {
        if (hidden % heads != 0)
            f.refuse("hidden_size " + std::to_string(hidden) + " is not a multiple of " +
                     "num_attention_heads " + std::to_string(heads) + " and head_dim is not given");
        return 0;
    }
    const int given = f.positive("head_dim");
    return given * heads == hidden ? 0 : given;
}

// eos_token_id within the vocabulary, else -1. A list (Llama 3 instruct's [128001, 128008,
// 128009]: any of them ends generation) gives its first, the one LlamaConfig's single
// eos_token_id had before lists.
int eos_token_id(const Value* eos, int vocab) {
    if (eos && eos->is_array()) eos = eos->array.empty() ? nullptr : &eos->array.front();
    if (!eos || !eos->is_integer() || eos->integer < 0 || eos->integer >= vocab) return -1;
    return static_cast<int>(eos->integer);
}

}  // namespace

std::string read_hf_model_type(const std::string& path) {
    const Value root = read_hf_config_file(path);
    const Value* type = root.find("model_type");
    return type && type->is_string() ? type->string : "";
}

HfLlamaConfig read_hf_llama_config(const std::string& path) {
    const Fields f(path, read_hf_config_file(path));
    const std::string type = f.text("model_type", "");
    HfLlamaConfig c;
    HfFamily family = HfFamily::llama;
    for (const HfFamily f : {HfFamily::qwen3, HfFamily::mixtral, HfFamily::qwen3_moe})
        if (type == hf_model_type(f)) family = f;
    if (type != hf_model_type(family)) refuse_model_type(path, type);
    c.qk_norm = family == HfFamily::qwen3 || family == HfFamily::qwen3_moe;
    if (c.qk_norm && f.flag("use_sliding_window", false))
        f.refuse("use_sliding_window is true (Qwen3's sliding-window attention)");
    c.vocab = f.positive("vocab_size");
    c.hidden = f.positive("hidden_size");
    c.layers = f.positive("num_hidden_layers");
    c.heads = f.positive("num_attention_heads");
    c.kv_heads = f.positive("num_key_value_heads", c.heads);
    c.ffn = f.positive("intermediate_size");
    c.max_positions = f.positive("max_position_embeddings", 2048);
    c.rope_theta = f.number("rope_theta", 10000.0);
    c.norm_eps = f.number("rms_norm_eps", 1e-6);
    c.tied = f.flag("tie_word_embeddings", false);
    c.eos = eos_token_id(f.find("eos_token_id"), c.vocab);
    if (c.heads % c.kv_heads != 0)
        throw Error(path + ": num_attention_heads " + std::to_string(c.heads) +
                    " is not a multiple of num_key_value_heads " + std::to_string(c.kv_heads));
    refuse_features(f);
    c.head_dim = head_dim(f, c.hidden, c.heads);
    c.moe = read_hf_moe(f, family, c.layers, c.ffn);
    return c;
}

std::string hf_llama_config_json(const HfLlamaConfig& c) {
    // GPT-2's <|endoftext|> begins and ends its documents; other vocabularies name none.
    constexpr int kGpt2Vocab = 50257, kEndOfText = 50256;
    const std::string architectures[] = {hf_architecture(c.family())};
    io::JsonLine j;
    j.add("architectures", std::span<const std::string>(architectures))
        .add("model_type", hf_model_type(c.family()))
        .add("torch_dtype", "float32")
        .add("vocab_size", c.vocab)
        .add("hidden_size", c.hidden)
        .add("intermediate_size", c.ffn)
        .add("num_hidden_layers", c.layers)
        .add("num_attention_heads", c.heads)
        .add("num_key_value_heads", c.kv_heads)
        .add("head_dim", c.head_dim > 0 ? c.head_dim : c.hidden / c.heads)
        .add("hidden_act", "silu")
        .add("max_position_embeddings", c.max_positions)
        .add("initializer_range", 0.02)
        .add_exact("rms_norm_eps", c.norm_eps)
        .add_exact("rope_theta", c.rope_theta)
        .add_null("rope_scaling")
        .add("tie_word_embeddings", c.tied)
        .add("attention_bias", false)
        .add("attention_dropout", 0.0)
        .add("mlp_bias", false)
        .add("pretraining_tp", 1)
        .add("use_cache", true)
        .add_null("pad_token_id");
    if (c.qk_norm) j.add("use_sliding_window", false);
    if (c.moe.enabled()) write_hf_moe(j, c.family(), c.moe, c.ffn);
    if (c.vocab == kGpt2Vocab)
        j.add("bos_token_id", kEndOfText).add("eos_token_id", kEndOfText);
    else
        j.add_null("bos_token_id").add_null("eos_token_id");
    return j.str() + "\n";
}

GptShape hf_llama_shape(const HfLlamaConfig& c, int max_seq) {
    GptShape s;
    s.arch = Arch::llama;
    s.vocab = c.vocab;
    s.padded_vocab = (c.vocab + 127) / 128 * 128;
    s.max_seq = max_seq;
    s.layers = c.layers;
    s.hidden = c.hidden;
    s.heads = c.heads;
    s.kv_heads = c.kv_heads;
    s.ffn = c.ffn;
    s.tied = c.tied;
    s.norm_eps = static_cast<float>(c.norm_eps);
    s.rope_theta = static_cast<float>(c.rope_theta);
    s.qk_norm = c.qk_norm;
    s.head_dim = c.head_dim;
    s.moe = c.moe;
    if (s.moe.enabled() && s.moe.ffn_hidden == 0) s.moe.ffn_hidden = c.ffn;
    return s;
}

}  // namespace trident::model
