// model.init_from naming a Hugging Face model folder: its config.json fills in the shape keys
// a config leaves out and is held to those it gives, at load time, so that a wrong folder is
// found before anything is built (see schema.h, take_hf_config).
#include <charconv>
#include <filesystem>
#include <variant>

#include "config/schema.h"
#include "model/hf_config.h"
#include "model/hf_eos_token.h"
#include "model/hf_llama_config.h"

namespace trident::config::detail {
namespace {

namespace fs = std::filesystem;

// One of our keys and config.json's value for it.
struct Taken {
    const char* key;      // "model.hidden"
    const char* hf_name;  // "hidden_size"
    std::variant<int*, double*, bool*> ours;
    std::variant<int, double, bool> theirs;
};

std::string shown(const std::variant<int, double, bool>& v) {
    if (const int* i = std::get_if<int>(&v)) return std::to_string(*i);
    if (const bool* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
    char text[32];
    const auto end = std::to_chars(text, text + sizeof text, std::get<double>(v)).ptr;
    return std::string(text, end);
}

std::variant<int, double, bool> value_of(const std::variant<int*, double*, bool*>& p) {
    return std::visit([](auto* x) -> std::variant<int, double, bool> { return *x; }, p);
}

// Each key given must equal config.json's value; each left out takes it, and counts as set
// (from config.json, below the file and every override) for the defaults that follow it.
void take(const std::vector<Taken>& keys, const std::string& config, Origins& origins) {
    for (const Taken& k : keys) {
        const auto ours = value_of(k.ours);
        if (origins.is_set(k.key)) {
            if (ours != k.theirs)
                throw ConfigError(origins.where(k.key) + ": " + k.key + ": " + shown(ours) +
                                  ", but " + config + " has " + k.hf_name + " " + shown(k.theirs) +
                                  " (leave the key out, or make them agree)");
            continue;
        }
        std::visit([&](auto* p) { *p = std::get<std::remove_pointer_t<decltype(p)>>(k.theirs); },
                   k.ours);
        origins.set(k.key, config, 0);
    }
}

// model.seq_len: left out, the model's own length; given, no longer than it.
void take_seq_len(ModelConfig& m, int max_positions, const char* hf_name, const std::string& config,
                  Origins& origins) {
    if (!origins.is_set("model.seq_len")) {
        m.seq_len = max_positions;
        origins.set("model.seq_len", config, 0);
    } else if (m.seq_len > max_positions) {
        throw ConfigError(origins.where("model.seq_len") + ": model.seq_len: " +
                          std::to_string(m.seq_len) + ", but " + config + " has " + hf_name + " " +
                          std::to_string(max_positions) + " (at most that many tokens)");
    }
}

// model.moe from a Mixtral or Qwen3-MoE config.json (model/hf_moe_config.h); a dense one's
// experts are 0.
void take_moe(model::MoeSettings& ours, model::MoeSettings hf, const std::string& config,
              Origins& origins) {
    take({{"model.moe.experts", "num_experts or num_local_experts", &ours.experts, hf.experts}},
         config, origins);
    if (!hf.enabled()) return;
    take(
        {{"model.moe.top_k", "num_experts_per_tok", &ours.top_k, hf.top_k},
         {"model.moe.ffn_hidden", "moe_intermediate_size", &ours.ffn_hidden, hf.ffn_hidden},
         {"model.moe.shared_experts", "n_shared_experts", &ours.shared_experts, hf.shared_experts},
         {"model.moe.normalize_top_k", "norm_topk_prob", &ours.normalize_top_k, hf.normalize_top_k},
         {"model.moe.scale", "routed_scaling_factor", &ours.scale, hf.scale},
         {"model.moe.aux_loss", "router_aux_loss_coef", &ours.aux_loss, hf.aux_loss},
         {"model.moe.first_dense", "mlp_only_layers' count", &ours.first_dense, hf.first_dense},
         {"model.moe.every", "decoder_sparse_step", &ours.every, hf.every}},
        config, origins);
    const bool sigmoid = hf.router == model::MoeRouter::sigmoid;
    if (origins.is_set("model.moe.router") && ours.router != hf.router)
        throw ConfigError(origins.where("model.moe.router") + ": model.moe.router, but " + config +
                          " has scoring_func " + (sigmoid ? "sigmoid" : "softmax") +
                          " (leave the key out, or make them agree)");
    if (origins.is_set("model.moe.router")) return;
    ours.router = hf.router;
    origins.set("model.moe.router", config, 0);
}

void take_llama(Config& cfg, const std::string& config, Origins& origins) {
    ModelConfig& m = cfg.model;
    const model::HfLlamaConfig hf = model::read_hf_llama_config(config);
    take({{"model.vocab_size", "vocab_size", &m.vocab_size, hf.vocab},
          {"model.hidden", "hidden_size", &m.hidden, hf.hidden},
          {"model.layers", "num_hidden_layers", &m.layers, hf.layers},
          {"model.heads", "num_attention_heads", &m.heads, hf.heads},
          {"model.kv_heads", "num_key_value_heads", &m.kv_heads, hf.kv_heads},
          {"model.head_dim", "head_dim", &m.head_dim,
           hf.head_dim > 0 ? hf.head_dim : hf.hidden / hf.heads},
          {"model.ffn_hidden", "intermediate_size", &m.ffn_hidden, hf.ffn},
          {"model.rope_theta", "rope_theta", &m.rope_theta, hf.rope_theta},
          {"model.norm_eps", "rms_norm_eps", &m.norm_eps, hf.norm_eps},
          {"model.tie_embeddings", "tie_word_embeddings", &m.tie_embeddings, hf.tied},
          {"model.qk_norm", "model_type qwen3's q_norm and k_norm", &m.qk_norm, hf.qk_norm}},
         config, origins);
    take_seq_len(m, hf.max_positions, "max_position_embeddings", config, origins);
    take_moe(m.moe, hf.moe, config, origins);
    // Its documents end with its eos token unless data.eod_token names another: config.json's,
    // else tokenizer_config.json's (model/hf_eos_token.h).
    if (origins.is_set("data.eod_token")) return;
    const std::string folder = fs::path(config).parent_path().string();
    const int tokenizer_eos = hf.eos >= 0 ? -1 : model::read_hf_eos_token(folder);
    const int eos = hf.eos >= 0 ? hf.eos : tokenizer_eos < hf.vocab ? tokenizer_eos : -1;
    if (eos < 0) return;
    cfg.data.eod_token = eos;
    origins.set("data.eod_token", hf.eos >= 0 ? config : folder + "/tokenizer_config.json", 0);
}

void take_gpt2(ModelConfig& m, const std::string& config, Origins& origins) {
    const model::HfGpt2Config hf = model::read_hf_gpt2_config(config);
    take({{"model.vocab_size", "vocab_size", &m.vocab_size, hf.vocab},
          {"model.hidden", "n_embd", &m.hidden, hf.hidden},
          {"model.layers", "n_layer", &m.layers, hf.layers},
          {"model.heads", "n_head", &m.heads, hf.heads},
          {"model.ffn_hidden", "n_inner", &m.ffn_hidden, hf.ffn}},
         config, origins);
    take_seq_len(m, hf.max_positions, "n_positions", config, origins);
}

}  // namespace

void take_hf_config(Config& cfg, Origins& origins) {
    ModelConfig& m = cfg.model;
    // A path no call can take (too long) is not a folder: validation names it.
    std::error_code error;
    if (!m.init_from || !fs::is_directory(*m.init_from, error)) return;
    const std::string config = (fs::path(*m.init_from) / "config.json").string();
    if (!fs::exists(config, error)) return;  // a Trident checkpoint
    const std::string where = origins.where("model.init_from");
    try {
        const std::string type = model::read_hf_model_type(config);
        const Arch arch = type == "gpt2" ? Arch::gpt2 : Arch::llama;
        if (origins.is_set("model.arch") && m.arch != arch)
            throw ConfigError(origins.where("model.arch") +
                              ": model.arch: " + (m.arch == Arch::llama ? "llama" : "gpt2") +
                              ", but " + config + " has model_type \"" + type +
                              "\" (leave the key out, or make them agree)");
        m.arch = arch;
        origins.set("model.arch", config, 0);
        if (arch == Arch::gpt2)
            take_gpt2(m, config, origins);
        else
            take_llama(cfg, config, origins);  // refuses any other model_type by name
    } catch (const ConfigError&) {
        throw;
    } catch (const Error& e) {
        throw ConfigError(where + ": model.init_from: " + e.what());
    }
}

}  // namespace trident::config::detail
