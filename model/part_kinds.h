// A kind of part is what a model spec (model/model_spec.h) names for each place in a layer: a
// name, the function that declares its tensors and linears for a model's shape, and the
// function that builds it on one rank from its tensors' offsets there. The kinds are listed by
// name in model/part_registry.cpp; the stage builder (model/stage_parts.h) and the planner
// build every part through these two functions, and nothing else knows which kind it holds.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "model/attention_core.h"
#include "model/dims.h"
#include "model/linear.h"
#include "model/model_spec.h"
#include "model/param_layout.h"

namespace trident::model {

class Norm;
class Attention;
class FeedForward;

// Low-rank adapters (model/lora_adapter.h): which linears of every layer carry one and their
// rank (LoraShape; rank 0: none, every parameter trains), the scale alpha / r of B·A, and the
// dropout on the adapters' input; and the frozen base's layer matrices in NF4 (model/nf4_base.h)
// in blocks of quant_block, with or without double quantization.
struct Lora {
    LoraShape shape;
    float scale = 0;
    float dropout = 0;
    std::size_t quant_block = 0;  // 0: the base as it is
    bool double_quant = true;
};

// What the parts are built from besides the layouts and the sizes.
struct PartOptions {
    float dropout = 0;  // residual branches, attention and the embedding
    Lora lora;
    AttentionSavedFn attention_saved;  // the backend's rule (Ops::attention_saved)
    MakeCore make_core;                // empty: training's attention core
    const GemmPolicy* gemm = nullptr;  // the layers' linears' GEMM (model/gemm.h); null: dense
    // data.documents: mask: each chunk's set keeps its windows' documents (model/documents.h).
    bool documents = false;
};

// One part's inputs on this rank: its tensors' offsets in the parameter buffer (in the order
// its kind declared them), the layer it belongs to (for its linears' adapters), the sizes, and
// the set and scratch it declares its buffers into.
struct PartBuild {
    const ModelSpec& spec;
    const Dims& d;
    std::vector<std::size_t> tensors;
    int layer = -1;                  // global index; -1: the head's final norm
    const ParamLayout* lora_layout;  // the adapters' (ParamLayout::for_lora), or null
    const PartOptions& options;
    SetSpec& set;
    ScratchSpec& scratch;

    std::size_t tensor(std::size_t i) const { return tensors[i]; }
    const GptShape& shape() const { return spec.shape; }
    // This rank's first head among all: its query heads are heads_begin .. + d.heads.
    int head_begin() const { return d.tensor_rank * d.heads; }
    // A linear of the part: its split, widths on this rank, weight and bias (kNoParam: none).
    LinearSpec linear(LinearSplit split, int in, int out, std::size_t weight,
                      std::size_t bias) const;
    // Adds the adapter of target t of this layer, if training.lora asks for one, over the
    // columns first .. first + width of the linear's output (width 0: all of them).
    void adapt(LinearSpec& linear, LoraTarget t, int first = 0, int width = 0) const;
};

// What a kind keeps for the backward as Korthikanti et al. count it, for a model's shape on
// `tensor` tensor-parallel ranks (the planner's published figure beside its own count).
using ActivationsFn = ActivationTerms (*)(const GptShape& shape, int tensor);

struct NormKind {
    const char* name;
    PartDecl (*declare)(const GptShape& shape);
    std::unique_ptr<Norm> (*build)(const PartBuild& in);
    ActivationsFn activations;
    bool eps;  // takes model.norm_eps (else its epsilon is its own)
};

struct AttentionKind {
    const char* name;
    PartDecl (*declare)(const GptShape& shape);
    std::unique_ptr<Attention> (*build)(const PartBuild& in);
    ActivationsFn activations;
    bool grouped;  // takes fewer key/value heads than query heads (model.kv_heads)
    bool rotary;   // rotates pairs of each head's channels at model.rope_theta
    bool qk_norm;  // normalizes each query and key head (model.qk_norm)
};

struct MlpKind {
    const char* name;  // model.mlp
    PartDecl (*declare)(const GptShape& shape);
    std::unique_ptr<FeedForward> (*build)(const PartBuild& in);
    ActivationsFn activations;
};

// The registered kinds (model/part_registry.cpp).
const std::vector<const NormKind*>& norm_kinds();
const std::vector<const AttentionKind*>& attention_kinds();
const std::vector<const MlpKind*>& mlp_kinds();

}  // namespace trident::model
