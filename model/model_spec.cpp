// The model's spec from its shape, and the tensors its parts declare (see model_spec.h).
#include "model/model_spec.h"

#include <string>

#include "kernels/error.h"
#include "model/part_kinds.h"

namespace trident::model {

namespace {

template <typename Kind>
const Kind* find_kind(const std::vector<const Kind*>& kinds, std::string_view name) {
    for (const Kind* k : kinds)
        if (name == k->name) return k;
    return nullptr;
}

std::string joined(const std::vector<std::string>& names) {
    std::string s;
    for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
    return s;
}

// A part's tensors, linears and other GEMMs named whole: `prefix` before each name.
PartDecl prefixed(PartDecl decl, const std::string& prefix) {
    for (TensorDecl& t : decl.tensors) t.name = prefix + t.name;
    for (LinearDecl& w : decl.linears) w.name = prefix + w.name;
    for (GemmDecl& g : decl.gemms) g.name = prefix + g.name;
    return decl;
}

}  // namespace

const char* lora_target_name(LoraTarget t) {
    static constexpr const char* kNames[kLoraTargets] = {
        "qkv", "attn_proj", "fc", "fc_proj", "q", "k", "v", "o", "gate", "up", "down"};
    return kNames[static_cast<std::size_t>(t)];
}

const char* default_mlp(Arch arch) {
    return arch == Arch::llama ? "swiglu" : "gelu";
}

std::string mlp_kind(const GptShape& shape) {
    return shape.mlp.empty() ? default_mlp(shape.arch) : shape.mlp;
}

bool family_mlp(const GptShape& shape) {
    return mlp_kind(shape) == default_mlp(shape.arch);
}

// Megatron-LM's ffn_hidden_size and GPT-2's n_inner: 4 x hidden. Llama's SwiGLU width: 2/3 of
// 4 x hidden (as many parameters in three matrices as GELU's two), rounded up to a multiple of
// 256 (11008 at hidden 4096); its head is its own, and adapters wrap q and v (PEFT's default
// for Llama, after Hu et al. 2021, §7.1), GPT-2's every linear of its layer. GPT-2's documents
// end with <|endoftext|>, 50256.
ArchDefaults arch_defaults(Arch arch, int hidden) {
    if (arch == Arch::llama)
        return {(8 * hidden / 3 + 255) / 256 * 256, false,        default_mlp(arch),
                {LoraTarget::q, LoraTarget::v},     std::nullopt, true};
    return {4 * hidden,
            true,
            default_mlp(arch),
            {LoraTarget::qkv, LoraTarget::attn_proj, LoraTarget::fc, LoraTarget::fc_proj},
            50256};
}

// The mixture of experts' kind is model.moe's layers' (model/moe_mlp.cpp), never model.mlp's.
constexpr std::string_view kMoeMlp = "moe";

std::vector<std::string> mlp_names() {
    std::vector<std::string> names;
    for (const MlpKind* k : mlp_kinds())
        if (k->name != kMoeMlp) names.emplace_back(k->name);
    return names;
}

bool is_mlp(std::string_view name) {
    return name != kMoeMlp && find_kind(mlp_kinds(), name) != nullptr;
}

ModelSpec resolve_spec(const GptShape& shape) {
    const bool llama = shape.arch == Arch::llama;
    ModelSpec s;
    s.shape = shape;
    s.layer_prefix = llama ? "layers." : "h.";
    s.token_embedding = llama ? "embed_tokens" : "wte";
    s.position_embedding = !llama;
    s.untied_head = llama;
    s.final_norm = find_kind(norm_kinds(), llama ? "rmsnorm" : "layernorm");
    s.final_norm_name = llama ? "norm" : "ln_f";
    LayerSpec layer;
    layer.norm = s.final_norm;
    layer.attention = find_kind(attention_kinds(), !llama          ? "gpt2"
                                                   : shape.qk_norm ? "grouped_qk_norm"
                                                                   : "grouped");
    const std::string mlp = mlp_kind(shape);
    layer.mlp = find_kind(mlp_kinds(), mlp);
    if (!layer.mlp)
        throw Error("model.mlp: \"" + mlp + "\" is no kind of MLP (" + joined(mlp_names()) + ")");
    layer.norm1_name = llama ? "input_layernorm" : "ln_1";
    layer.attention_name = llama ? "self_attn" : "attn";
    layer.norm2_name = llama ? "post_attention_layernorm" : "ln_2";
    layer.mlp_name = "mlp";
    s.layers.assign(static_cast<std::size_t>(shape.layers), layer);
    // model.moe's layers hold the mixture of experts instead (model/moe_mlp.h).
    for (int l = 0; l < shape.layers; ++l)
        if (shape.moe.moe_layer(l))
            s.layers[static_cast<std::size_t>(l)].mlp = find_kind(mlp_kinds(), kMoeMlp);
    return s;
}

std::vector<TensorDecl> ModelSpec::embedding_tensors() const {
    const int64_t H = shape.hidden;
    std::vector<TensorDecl> t{{token_embedding + ".weight",
                               {shape.padded_vocab, H},
                               {SplitKind::vocabulary},
                               Init::normal,
                               true}};
    if (position_embedding) t.push_back({"wpe.weight", {shape.max_seq, H}, {}, Init::normal, true});
    return t;
}

std::vector<TensorDecl> ModelSpec::head_tensors() const {
    std::vector<TensorDecl> t = prefixed(final_norm->declare(shape), final_norm_name + ".").tensors;
    if (!shape.tied)
        t.push_back({"lm_head.weight",
                     {shape.padded_vocab, shape.hidden},
                     {SplitKind::vocabulary},
                     Init::normal,
                     true});
    return t;
}

std::vector<PartDecl> ModelSpec::layer_decls(int l) const {
    const LayerSpec& layer = layers.at(static_cast<std::size_t>(l));
    return {layer.norm->declare(shape), layer.attention->declare(shape), layer.norm->declare(shape),
            layer.mlp->declare(shape)};
}

std::vector<NamedPart> ModelSpec::layer_parts(int l) const {
    std::vector<PartDecl> decls = layer_decls(l);
    std::vector<NamedPart> parts;
    for (std::size_t p = 0; p < decls.size(); ++p)
        parts.push_back({part_prefix(l, static_cast<LayerPart>(p)), std::move(decls[p])});
    return parts;
}

std::string ModelSpec::part_prefix(int l, LayerPart p) const {
    const LayerSpec& layer = layers.at(static_cast<std::size_t>(l));
    const std::string* const names[kLayerParts] = {&layer.norm1_name, &layer.attention_name,
                                                   &layer.norm2_name, &layer.mlp_name};
    return layer_prefix + std::to_string(l) + "." + *names[static_cast<std::size_t>(p)] + ".";
}

std::vector<LinearDecl> ModelSpec::layer_linears(int l) const {
    std::vector<LinearDecl> linears;
    for (const NamedPart& part : layer_parts(l))
        for (const LinearDecl& w : prefixed(part.decl, part.prefix).linears) linears.push_back(w);
    return linears;
}

std::vector<GemmDecl> ModelSpec::layer_gemms(int l) const {
    std::vector<GemmDecl> gemms;
    for (const NamedPart& part : layer_parts(l))
        for (const GemmDecl& g : prefixed(part.decl, part.prefix).gemms) gemms.push_back(g);
    return gemms;
}

ActivationTerms ModelSpec::layer_activations(int l, int tensor) const {
    const LayerSpec& layer = layers.at(static_cast<std::size_t>(l));
    ActivationTerms sum;
    for (const ActivationTerms& t :
         {layer.norm->activations(shape, tensor), layer.attention->activations(shape, tensor),
          layer.norm->activations(shape, tensor), layer.mlp->activations(shape, tensor)}) {
        sum.replicated += t.replicated;
        sum.split += t.split;
        sum.scores += t.scores;
    }
    return sum;
}

bool ModelSpec::same_parts(const ModelSpec& other) const {
    return layer_prefix == other.layer_prefix && token_embedding == other.token_embedding &&
           position_embedding == other.position_embedding && final_norm == other.final_norm &&
           final_norm_name == other.final_norm_name && layers == other.layers;
}

}  // namespace trident::model
