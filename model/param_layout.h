// Where every GPT parameter lives in the flat parameter buffer of one tensor-parallel rank.
//
// All parameters a rank holds sit in one contiguous buffer of the run's precision (and their
// gradients in another of the same layout), so the optimizer, the gradient norm and the ZeRO-1
// sharding see one range; offsets count elements, whatever their type. Tensors are named as in
// Hugging Face's GPT-2 (without the "transformer." prefix), but linear weights keep our [out, in]
// layout, and wte keeps the padded vocabulary rows (always zero).
//
// Under M-way tensor parallelism (Megatron's split) each rank holds a slice of some tensors:
//   wte            rows r*Vp/M ..            (vocab-parallel embedding and LM head)
//   c_attn w, b    rows of q, of k and of v for heads r*NH/M .. (column-parallel, by head)
//   attn.c_proj w  columns r*H/M ..          (row-parallel; its bias is whole)
//   mlp.c_fc w, b  rows r*F/M ..             (column-parallel)
//   mlp.c_proj w   columns r*F/M ..          (row-parallel; its bias is whole)
// and every other tensor whole (replicated: wpe, LayerNorms, row-parallel biases). A layout
// with tensor_size 1 is the whole model; shard_params/unshard_params map between the two.
//
// Under P-stage pipeline parallelism with v chunks per stage (StagePlan), a stage holds the
// layers of its chunks (global chunk g = c·P + stage holds the run of layers after those of
// chunks 0 .. g-1, StagePlan::chunk_layers[g] of them), wte and wpe
// on the first stage (the embedding), ln_f and wte on the last (the LM head, tied to wte: the
// two copies get the same gradient, summed over the embedding group).
//
// Order: wte, wpe, then layer by layer (so a stage's chunks are contiguous runs), ln_f.
//
// A llama model (Arch::llama) holds Hugging Face LlamaForCausalLM's tensors, named as there
// without the "model." prefix, linear weights [out, in] as there: embed_tokens (the padded
// vocabulary's rows, split by rows like wte), per layer input_layernorm, self_attn.q_proj,
// k_proj, v_proj (rows: this rank's query heads, and its key/value heads), o_proj (columns),
// post_attention_layernorm, mlp.gate_proj, up_proj (rows), down_proj (columns); norm, and
// lm_head (padded rows, split by rows) unless tied to embed_tokens. No biases, no position
// embedding. q, k and v are adjacent, so this rank's three slices are one [(NH + 2·KVH)·d/M, H]
// weight, and gate and up one [2F/M, H]: each pair of linears runs as one GEMM.
// With fewer key/value heads than tensor ranks (M = r·KVH, r > 1: Megatron's rule for
// grouped-query attention) rank t's NH/M query heads all belong to key/value head t / r, and
// it holds that head's d rows of k_proj and of v_proj whole: each such slice is replicated on
// the r consecutive ranks of one head (ParamTensor::replicas, kv_replicas), the first of which
// speaks for it (held_elsewhere); the replicas' gradients are summed over those r ranks.
//
// Low-rank adapters (LoRA) have a layout of their own, built by ParamLayout::for_lora: for
// each layer held and each target linear W (out, in), A (r, in) then B (out, r), named as
// W's weight with lora_A / lora_B in place of the last part ("h.3.attn.c_attn.lora_A.weight",
// llama "layers.3.self_attn.k_proj.lora_A.weight").
// They follow W's split, so that the adapter needs no collective of its own in the forward:
//   column-parallel W (qkv, fc; q, k, v, gate, up)   A replicated, B split like W's rows
//                                                     (k's and v's: by key/value head)
//   row-parallel W (the c_proj's; o, down)           A split by columns like W, B replicated
// Each layer's adapters make one unit; the layout has no embedding and no ln_f.
//
// Units: the runs of tensors that ZeRO-2 reduces and ZeRO-3 gathers as one
// (src/data_parallel/zero_units.h): the embedding (wte and wpe on a single stage; on a pipeline wte
// and wpe each alone, so that the first and the last stage hold the same unit of the tied wte),
// each layer, and ln_f. With a unit alignment A > 1 each unit starts at a multiple of A and the
// buffer's total is one too (the padding between units is zero and belongs to no tensor), so every
// unit splits evenly over A data-parallel ranks.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace trident::model {

// The layer kind: GPT-2's (LayerNorm, learned positions, GELU MLP, biases, tied head) or
// Llama's (RMSNorm, rotary positions, SwiGLU, grouped-query attention, no biases).
enum class Arch { gpt2, llama };

// The sizes that fix a GPT's parameters, and the kind of its layers.
struct GptShape {
    int vocab = 0;         // V, real vocabulary
    int padded_vocab = 0;  // Vp >= V, multiple of 128 * tensor-parallel size
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
};

// Where the P·v global chunks of the pipeline live (docs/ARCHITECTURE.md, "Schedules").
// Round robin: global chunk g is local chunk g / P of stage g mod P. V-shaped (ZB-V, v = 2):
// stage r holds global chunks r and 2P - 1 - r as its local chunks 0 and 1, so the
// activations go down the stages and back up, and stage 0 holds the first and the last chunk.
enum class Placement { round_robin, v_shape };

struct ChunkMap {
    Placement placement = Placement::round_robin;
    int stages = 1;  // P
    int chunks = 1;  // v, per stage

    int global(int stage, int c) const {
        return placement == Placement::v_shape && c == 1 ? 2 * stages - 1 - stage
                                                         : c * stages + stage;
    }
    int stage_of(int g) const {
        return placement == Placement::v_shape && g >= stages ? 2 * stages - 1 - g : g % stages;
    }
    int local(int g) const { return g / stages; }     // for both placements
    int last() const { return stages * chunks - 1; }  // the global chunk with the loss
};

// Which part of the model a pipeline stage holds (P = v = 1: all of it).
struct StagePlan {
    int stages = 1;  // P
    int stage = 0;   // this stage, 0 .. P-1
    int chunks = 1;  // v, model chunks per stage (interleaved schedule, ZB-V)
    // Layers of each global chunk, in order (P·v counts adding up to the model's layers; a
    // chunk may hold none). Empty: every chunk holds an equal share.
    std::vector<int> chunk_layers;
    Placement placement = Placement::round_robin;

    ChunkMap map() const { return {placement, stages, chunks}; }
    int global_chunk(int c) const { return map().global(stage, c); }
    // Whether this stage holds the embedding (global chunk 0), and the LM head (the last
    // global chunk): stage P - 1 round robin, stage 0 V-shaped.
    bool first() const { return stage == 0; }
    bool last() const { return map().stage_of(map().last()) == stage; }
};

// How a tensor is divided over the tensor-parallel ranks.
enum class Split {
    replicated,  // whole on every rank
    rows,        // rank r holds rows r*R/M .. of R
    columns,     // rank r holds columns r*K/M .. of K
    qkv_rows,    // rank r holds its rows of each of the three (q, k, v) blocks of rows
};

struct ParamTensor {
    std::string name;                 // e.g. "h.3.attn.c_attn.weight"
    std::vector<int64_t> shape;       // this rank's, e.g. {3H/M, H}
    std::vector<int64_t> full_shape;  // the whole tensor's, e.g. {3H, H}
    std::size_t offset = 0;           // in elements, into the flat buffer
    std::size_t numel = 0;
    bool decay = false;  // weight decay applies (matrices and embeddings)
    Split split = Split::replicated;
    // Split::rows: the consecutive tensor ranks holding the same slice (rank t holds slice
    // t / replicas of M / replicas); 1 but for k_proj and v_proj when M > KVH.
    int replicas = 1;
};

// The tensor ranks that hold each key/value head's rows: M / KVH when M > KVH, else 1
// (each rank holds KVH / M heads of its own).
int kv_replicas(int kv_heads, int tensor_size);

// The offset of a tensor the model does not have (a llama layer's biases, its wpe).
inline constexpr std::size_t kNoParam = SIZE_MAX;

// Offsets of one transformer block's tensors in the flat buffer (local shapes). A llama layer
// fills them with its own (biases kNoParam): ln1 input_layernorm, qkv q_proj (followed by
// k_proj and v_proj: (NH + 2·KVH)·d/M rows), attn_proj o_proj, ln2 post_attention_layernorm,
// fc gate_proj (followed by up_proj: 2F/M rows), fc_proj down_proj.
struct LayerParams {
    std::size_t ln1_w, ln1_b;              // (H), (H)
    std::size_t qkv_w, qkv_b;              // (3H/M, H), (3H/M)
    std::size_t attn_proj_w, attn_proj_b;  // (H, H/M), (H)
    std::size_t ln2_w, ln2_b;              // (H), (H)
    std::size_t fc_w, fc_b;                // (F/M, H), (F/M)
    std::size_t fc_proj_w, fc_proj_b;      // (H, F/M), (H)
};

// The linears of a block that can carry an adapter, indexing LoraShape::targets and
// LayerLora: GPT-2's four, then Llama's seven (docs/ARCHITECTURE.md, "Vocabulary").
enum class LoraTarget { qkv, attn_proj, fc, fc_proj, q, k, v, o, gate, up, down };
inline constexpr int kLoraTargets = 11;
// Whether target t is one of Llama's linears (else GPT-2's).
inline bool is_llama_target(LoraTarget t) {
    return t >= LoraTarget::q;
}

// Which linears of every layer carry an adapter, and its rank r.
struct LoraShape {
    int rank = 0;
    std::array<bool, kLoraTargets> targets{};
    bool has(LoraTarget t) const { return targets[static_cast<std::size_t>(t)]; }
};

// Offsets of one layer's adapters in the adapters' flat buffer (local shapes), kNoLora
// where the linear carries none.
inline constexpr std::size_t kNoLora = SIZE_MAX;
struct LayerLora {
    std::array<std::size_t, kLoraTargets> a, b;  // A (r, in/M or in), B (out/M or out, r)
};

class ParamLayout {
public:
    // The layout of tensor-parallel rank `tensor_rank` of `tensor_size` on the stage `plan`,
    // its units aligned to `unit_align` elements (see the top of this file).
    // Throws trident::Error when heads, ffn or padded_vocab do not divide by tensor_size,
    // kv_heads neither divides nor is a multiple of it, or
    // the chunks' layers do not make the model's (without counts: do not divide by P·v).
    explicit ParamLayout(const GptShape& shape, int tensor_rank = 0, int tensor_size = 1,
                         const StagePlan& plan = {}, int unit_align = 1);
    // The layout of the low-rank adapters of that rank's layers (see the top of this file),
    // its units aligned alike.
    static ParamLayout for_lora(const GptShape& shape, const LoraShape& lora, int tensor_rank = 0,
                                int tensor_size = 1, const StagePlan& plan = {},
                                int unit_align = 1);

    const GptShape& shape() const { return shape_; }
    const std::vector<ParamTensor>& tensors() const { return tensors_; }
    std::size_t total() const { return total_; }  // elements in the flat buffer
    // The units, [begin, end) in buffer order, covering the buffer (padding included).
    const std::vector<std::pair<std::size_t, std::size_t>>& units() const { return units_; }
    int tensor_rank() const { return tensor_rank_; }
    int tensor_size() const { return tensor_size_; }
    const StagePlan& plan() const { return plan_; }
    // Layers of local chunk c, and the global index of its first.
    int chunk_layers(int c) const;
    int first_layer(int c) const;

    // This rank's share of the split dimensions.
    int vocab_begin() const { return tensor_rank_ * vocab_local(); }
    int vocab_local() const { return shape_.padded_vocab / tensor_size_; }
    int heads_begin() const { return tensor_rank_ * heads_local(); }
    int heads_local() const { return shape_.heads / tensor_size_; }
    int hidden_local() const { return shape_.hidden / tensor_size_; }  // attention width
    int ffn_local() const { return shape_.ffn / tensor_size_; }

    std::size_t wte() const { return wte_; }      // (Vp/M, H), first (and if tied last) stage
    std::size_t wpe() const { return wpe_; }      // (T, H), first stage; llama kNoParam
    std::size_t lnf_w() const { return lnf_w_; }  // (H), last stage
    std::size_t lnf_b() const { return lnf_b_; }  // (H), last stage; llama kNoParam
    std::size_t head() const { return head_; }    // (Vp/M, H) the LM head's weight: wte if tied
    // The ranges [begin, end) of the embedding's tensors (wte, wpe: first stage) and the
    // head's (the final norm, and an untied LM head: last stage).
    std::pair<std::size_t, std::size_t> embedding_range() const { return embedding_range_; }
    std::pair<std::size_t, std::size_t> head_range() const { return head_range_; }
    // The token embedding's name: wte.weight, llama embed_tokens.weight.
    const char* wte_name() const;
    // The tensors of global layer l, which must be one of this stage's, and the range
    // [begin, end) of the flat buffer they fill (a layer's tensors are contiguous).
    const LayerParams& layer(int l) const;
    std::pair<std::size_t, std::size_t> layer_range(int l) const;
    // An adapters' layout: its rank and targets, and the adapters of global layer l.
    const LoraShape& lora() const { return lora_; }
    const LayerLora& layer_lora(int l) const;

    // The tensor of that name, or nullptr.
    const ParamTensor* find(const std::string& name) const;
    // Whether this rank's copy of t is another rank's too and that rank speaks for it: a
    // replicated tensor off tensor rank 0, a key/value head's rows off the first of its
    // replicas, or the tied wte off the first stage. Norms count,
    // and checkpoints and the whole model take, every element once.
    bool held_elsewhere(const ParamTensor& t) const;

private:
    ParamLayout(const GptShape& shape, const LoraShape* lora, int tensor_rank, int tensor_size,
                const StagePlan& plan, int unit_align);
    std::size_t add(const std::string& name, std::vector<int64_t> full_shape, bool decay,
                    Split split, int replicas = 1);
    // One layer's adapters, their names starting with `prefix` ("h.3.").
    void add_lora(const std::string& prefix, const LoraShape& lora);
    // One layer's tensors, their names starting with `prefix`.
    LayerParams add_gpt2_layer(const std::string& prefix);
    LayerParams add_llama_layer(const std::string& prefix);
    // Global layer l's index among those held.
    std::size_t layer_index(int l) const;

    GptShape shape_;
    int tensor_rank_, tensor_size_;
    StagePlan plan_;
    std::vector<ParamTensor> tensors_;
    std::vector<int> layer_ids_;          // global index of each layer held, ascending
    std::vector<LayerParams> layers_;     // their tensors (the model's layout)
    std::vector<LayerLora> lora_layers_;  // their adapters (an adapters' layout)
    std::vector<std::pair<std::size_t, std::size_t>> layer_ranges_;
    LoraShape lora_;
    std::vector<std::pair<std::size_t, std::size_t>> units_;
    std::size_t total_ = 0;
    std::pair<std::size_t, std::size_t> embedding_range_, head_range_;
    std::size_t wte_ = 0, wpe_ = kNoParam, lnf_w_ = 0, lnf_b_ = kNoParam, head_ = 0;
};

// Copies this rank's slice of every tensor it holds from `full` (the buffer of a layout of
// the whole model: tensor_size 1, one stage) into `local` (the buffer of `local_layout`).
void shard_params(const ParamLayout& full_layout, const float* full,
                  const ParamLayout& local_layout, float* local);
// Where tensor rank `tensor_rank`'s slice `t` lies within the whole tensor: calls
// fn(local, full, count) for each contiguous run of it, `local` an element index into the
// slice and `full` into the whole tensor (row-major over full_shape), both increasing.
void for_each_slice_run(const ParamTensor& t, int tensor_rank,
                        const std::function<void(std::size_t, std::size_t, std::size_t)>& fn);
// The reverse: writes this rank's slices back into their places in `full`.
void unshard_params(const ParamLayout& local_layout, const float* local,
                    const ParamLayout& full_layout, float* full);

// This rank's share of the whole (a buffer of `whole_layout`, the same tensors for tensor_size
// 1 and one stage): its parts of `local` in their places, zero elsewhere, each element written
// by exactly one rank of the stage and tensor groups (held_elsewhere), so that summing the
// shares of all ranks gives the whole.
std::vector<float> share_of_whole(const ParamLayout& local_layout, const std::vector<float>& local,
                                  const ParamLayout& whole_layout);

}  // namespace trident::model
