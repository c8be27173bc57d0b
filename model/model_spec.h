// The model as its config resolves it, once: the sizes (GptShape) and, per layer, which kind of
// each part it is made of — the norm before attention, the attention, the norm before the MLP,
// the MLP — with the names its tensors lie under, and the embedding and head around the layers.
// Megatron-Core's TransformerLayerSubmodules and torchtitan's model args are the models: a layer
// asks its spec which parts to build, never the config.
//
// resolve_spec and the functions beside it are the one place that reads GptShape::arch, the
// model's family (the Hugging Face mappers read it too, to name files as that family's);
// everything else asks the spec and its parts' kinds. A kind of part is a set of functions
// (declare its tensors, build it, model/part_kinds.h) registered under a name in
// model/part_registry.cpp: a new kind is new files and one line there (docs/ARCHITECTURE.md,
// "How to add a layer kind").
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/moe_settings.h"
#include "model/tensor_decl.h"

namespace trident::model {

// The model's family: GPT-2's (LayerNorm, learned positions, GELU MLP, biases, tied head) or
// Llama's (RMSNorm, rotary positions, SwiGLU, grouped-query attention, no biases). It chooses
// the parts and their names; model.mlp may swap the MLP for another registered kind.
enum class Arch { gpt2, llama };

// The sizes that fix a model's parameters, and what it is made of.
struct GptShape {
    int vocab = 0;         // V, real vocabulary
    int padded_vocab = 0;  // Vp >= V, multiple of 128 · the tensor-parallel degree M
    int max_seq = 0;       // T, rows of wpe
    int layers = 0;        // L
    int hidden = 0;        // H
    int heads = 0;         // NH
    int ffn = 0;           // F, MLP width (llama: SwiGLU's inner width)
    int kv_heads = 0;      // KVH, key/value heads (grouped-query attention); gpt2: = heads
    Arch arch = Arch::gpt2;
    bool tied = true;  // the LM head is the token embedding (gpt2 always)
    // Llama's RMSNorm epsilon and rotary base θ.
    float norm_eps = 1e-5f;
    float rope_theta = 10000.0f;
    // Qwen3's RMSNorm over each query and key head (llama: the kind "grouped_qk_norm").
    bool qk_norm = false;
    // The MLP's kind (model.mlp, a name registered in model/part_registry.cpp); empty: the
    // family's own (gelu for gpt2, swiglu for llama).
    std::string mlp{};
    // A mixture of experts in the layers model.moe names (experts 0: none).
    MoeSettings moe{};
    int head_dim = 0;  // d, each head's width (llama); 0: H / NH

    int head_size() const { return head_dim > 0 ? head_dim : hidden / heads; }
    // The attention's width, NH·d: q's rows and o's columns (H unless head_dim says otherwise).
    int attention_width() const { return heads * head_size(); }
};

struct NormKind;
struct AttentionKind;
struct MlpKind;

// One layer: its parts' kinds, and the names under which each part's tensors lie within the
// layer ("h.3." + "attn" + "." + "c_attn.weight").
struct LayerSpec {
    const NormKind* norm = nullptr;  // both norms
    const AttentionKind* attention = nullptr;
    const MlpKind* mlp = nullptr;
    std::string norm1_name, attention_name, norm2_name, mlp_name;

    bool operator==(const LayerSpec&) const = default;
};

// What a part keeps for the backward as Korthikanti et al. count it (arXiv 2205.05198, §4;
// docs/FORMULAS.md), in units of s·b·h bytes of 16-bit activations: what every tensor rank
// keeps whole without sequence parallelism, what tensor parallelism splits, and the attention
// scores' coefficient of a·s/h (split too).
struct ActivationTerms {
    double replicated = 0, split = 0, scores = 0;
};

// One part of a layer as the layout places it: its tensors' names start with `prefix`
// ("h.3.attn.").
struct NamedPart {
    std::string prefix;
    PartDecl decl;
};

// Layer l's four parts, in buffer order.
enum class LayerPart { norm1, attention, norm2, mlp };
inline constexpr int kLayerParts = 4;

struct ModelSpec {
    GptShape shape;
    std::string layer_prefix;        // "h." or "layers.": layer l's names start with it, l, "."
    std::string token_embedding;     // the token embedding's name: "wte" or "embed_tokens"
    bool position_embedding = true;  // a learned position embedding, "wpe"
    // The LM head may be its own matrix (model.tie_embeddings: false); GPT-2's is its token
    // embedding.
    bool untied_head = false;
    const NormKind* final_norm = nullptr;
    std::string final_norm_name;    // "ln_f" or "norm"
    std::vector<LayerSpec> layers;  // per layer, in order

    // The tensors of the embedding (the token embedding, then wpe) and of the head (the final
    // norm's, then an untied LM head's "lm_head.weight"), named whole.
    std::vector<TensorDecl> embedding_tensors() const;
    std::vector<TensorDecl> head_tensors() const;
    // Layer l's parts in buffer order (LayerPart), their tensors and linears named within
    // their part.
    std::vector<NamedPart> layer_parts(int l) const;
    // Where layer l's part p's tensors lie: its names start with this ("h.3.attn.").
    std::string part_prefix(int l, LayerPart p) const;
    // What layer l's parts declare, in buffer order: layer_parts without the prefixes.
    std::vector<PartDecl> layer_decls(int l) const;
    // Layer l's linears, named whole ("h.3.attn.c_attn"), in the order they compute.
    std::vector<LinearDecl> layer_linears(int l) const;
    // Layer l's GEMMs outside its linears (a router, routed experts), named whole.
    std::vector<GemmDecl> layer_gemms(int l) const;
    // Layer l's activations in Korthikanti et al.'s terms, its parts' summed, on `tensor`
    // tensor-parallel ranks.
    ActivationTerms layer_activations(int l, int tensor) const;
    // The same kinds of part, named alike, around and in each of as many layers.
    bool same_parts(const ModelSpec& other) const;
};

// The spec of a model of this shape. Throws trident::Error naming model.mlp when it names no
// registered kind.
ModelSpec resolve_spec(const GptShape& shape);
// The family's own MLP kind's name, and the names model.mlp may give (registered).
const char* default_mlp(Arch arch);
// The MLP kind's name: model.mlp, or the family's own where that is empty; and whether it is
// the family's own (the checkpoint manifest leaves it unsaid then).
std::string mlp_kind(const GptShape& shape);
bool family_mlp(const GptShape& shape);

// What a family's config takes unless it says otherwise, at model.hidden `hidden`.
struct ArchDefaults {
    int ffn = 0;                           // model.ffn_hidden
    bool tied = true;                      // model.tie_embeddings
    const char* mlp = nullptr;             // model.mlp
    std::vector<LoraTarget> lora_targets;  // training.lora.targets
    // data.eod_token: GPT-2's <|endoftext|>; none for a llama, whose tokenizer is its own
    // (its config.json's eos_token_id, src/config/hf_folder.cpp, or the key).
    std::optional<int> eod_token;
    bool moe = false;  // takes model.moe (its experts are SwiGLU MLPs)
};
ArchDefaults arch_defaults(Arch arch, int hidden);
std::vector<std::string> mlp_names();
// Whether `name` is a registered MLP kind.
bool is_mlp(std::string_view name);

}  // namespace trident::model
