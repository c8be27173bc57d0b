// The kinds of part a model spec may name (model/part_kinds.h), one line each: a new kind of
// norm, attention or MLP is its own files and one line here (docs/ARCHITECTURE.md, "How to add a
// layer kind"). Each line declares the kind its files define and lists it.
#include "model/part_kinds.h"

namespace trident::model {

#define TRIDENT_NORM_KINDS(KIND) \
    KIND(layer_norm_kind)        \
    KIND(rms_norm_kind)          \
    /* the norms */

#define TRIDENT_ATTENTION_KINDS(KIND) \
    KIND(gpt2_attention_kind)         \
    KIND(grouped_attention_kind)      \
    KIND(qk_norm_attention_kind)      \
    /* the attentions */

#define TRIDENT_MLP_KINDS(KIND) \
    KIND(gelu_mlp_kind)         \
    KIND(swiglu_mlp_kind)       \
    KIND(relu2_mlp_kind)        \
    KIND(moe_mlp_kind)          \
    /* the MLPs */

#define TRIDENT_DECLARE_NORM(kind) extern const NormKind kind;
#define TRIDENT_DECLARE_ATTENTION(kind) extern const AttentionKind kind;
#define TRIDENT_DECLARE_MLP(kind) extern const MlpKind kind;
#define TRIDENT_LIST(kind) &kind,

TRIDENT_NORM_KINDS(TRIDENT_DECLARE_NORM)
TRIDENT_ATTENTION_KINDS(TRIDENT_DECLARE_ATTENTION)
TRIDENT_MLP_KINDS(TRIDENT_DECLARE_MLP)

const std::vector<const NormKind*>& norm_kinds() {
    static const std::vector<const NormKind*> kinds{TRIDENT_NORM_KINDS(TRIDENT_LIST)};
    return kinds;
}

const std::vector<const AttentionKind*>& attention_kinds() {
    static const std::vector<const AttentionKind*> kinds{TRIDENT_ATTENTION_KINDS(TRIDENT_LIST)};
    return kinds;
}

const std::vector<const MlpKind*>& mlp_kinds() {
    static const std::vector<const MlpKind*> kinds{TRIDENT_MLP_KINDS(TRIDENT_LIST)};
    return kinds;
}

}  // namespace trident::model
