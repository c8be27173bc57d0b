// What a part of the model declares of its parameters: each tensor's name, whole shape, how
// the tensor-parallel ranks split it, how it starts and whether it trains; and the linears it
// computes with, which low-rank adapters may wrap, and its other GEMMs (a router, routed
// experts), all of whose GEMMs the FLOPs count. Everything that lays out, names or counts
// parameters derives from these declarations: every rank's flat buffers and their units
// (model/param_layout.h), the checkpoint's tensor names, the
// initialisation, the planner's counts, the adapters' layout and the Hugging Face mapping
// (docs/ARCHITECTURE.md, "The model").
//
// Shapes are the whole model's; linear weights are [out, in] as torch.nn.Linear.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trident::model {

// How the M tensor-parallel ranks divide a tensor (Megatron's split, docs/ARCHITECTURE.md,
// "Tensor parallelism").
enum class SplitKind {
    replicated,  // whole on every rank
    column,      // a column-parallel linear's weight or bias: rank r holds rows r·R/M .. of R
    row,         // a row-parallel linear's weight: rank r holds columns r·K/M .. of K
    vocabulary,  // the padded vocabulary's rows (Vp, multiple of 128·M): rank r holds r·Vp/M ..
};

struct Split {
    SplitKind kind = SplitKind::replicated;
    // column: the rows are this many blocks (GPT-2's c_attn: q, k and v), each split alike, so
    // that rank r holds its rows of every block.
    int blocks = 1;
    // column: the rows come in this many groups that no rank divides (the key/value heads of
    // grouped-query attention; 0: no such constraint). With more ranks than groups each group
    // is held whole by M / groups consecutive ranks (its replicas).
    int groups = 0;
    // A routed expert's index among its layer's N experts (-1: not an expert's). Under expert
    // parallelism with the experts' weights split (model/param_layout.h) only expert rank
    // expert / (N / E) holds it.
    int expert = -1;
};

// How a tensor starts (a pure function of (seed, tensor, element): model/gpt_params.cpp).
enum class Init {
    zeros,     // biases
    ones,      // norm gains
    normal,    // normal(0, init_std); a vocabulary-split tensor's padded rows stay zero
    residual,  // normal(0, init_std / sqrt(2·layers)): GPT-2's projections into the residual
    // uniform in ±1/sqrt(in) (PEFT's Kaiming-uniform with a = √5): an adapter's A (model/lora.h)
    fan_in_uniform,
};

struct TensorDecl {
    std::string name;            // within its part: "c_attn.weight"
    std::vector<int64_t> shape;  // the whole model's
    Split split;
    Init init = Init::normal;
    bool decay = false;  // weight decay applies (matrices and embeddings)
    bool trains = true;  // the optimizer updates it (else it keeps its value; checkpoints save it)
};

// The linears an adapter may wrap (training.lora.targets, docs/ARCHITECTURE.md "Vocabulary"):
// GPT-2's four, then Llama's seven.
enum class LoraTarget { qkv, attn_proj, fc, fc_proj, q, k, v, o, gate, up, down };
inline constexpr int kLoraTargets = 11;
// The target's name in training.lora.targets and adapters files ("qkv", ..., "down").
const char* lora_target_name(LoraTarget t);

// A linear a part computes: its weight's name (the adapters' names derive from it), its whole
// widths, its weight's split (column: by output rows; row: by input columns) and the adapter
// target it answers to. A part may run several as one GEMM (Llama's q, k and v): each is
// declared on its own.
struct LinearDecl {
    std::string name;  // within its part: "c_attn"
    int64_t out = 0, in = 0;
    Split split;
    LoraTarget target = LoraTarget::qkv;
};

// A GEMM a part runs outside its split linears (a mixture of experts' router and routed
// experts, model/moe_mlp.cpp): its weight's whole widths and split, and the share of the
// microbatch's tokens it runs on (a routed expert's: top_k / experts, on average). The FLOPs
// and the parameters active per token count it; adapters never wrap it.
struct GemmDecl {
    std::string name;  // within its part: "experts.0.gate_proj"
    int64_t out = 0, in = 0;
    Split split;
    double share = 1;
};

// What one part declares: its tensors in the order they lie in the flat buffer, its linears in
// the order it computes them, and its other GEMMs.
struct PartDecl {
    std::vector<TensorDecl> tensors;
    std::vector<LinearDecl> linears;
    std::vector<GemmDecl> gemms{};
};

}  // namespace trident::model
