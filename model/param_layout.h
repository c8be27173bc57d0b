// Where every parameter lives in the flat parameter buffer of one tensor-parallel rank, as the
// model's parts declare them (model/tensor_decl.h, model/model_spec.h).
//
// All parameters a rank holds sit in one contiguous buffer of the run's precision (and their
// gradients in another of the same layout), so the optimizer, the gradient norm and the ZeRO-1
// sharding see one range; offsets count elements, whatever their type. Each tensor is named as
// its part declares it under the spec's names (GPT-2's "h.3.attn.c_attn.weight", Llama's
// "layers.3.self_attn.q_proj.weight": the names the checkpoints hold, which were chosen as the
// two families' Hugging Face names; model/hf_gpt2.h and model/hf_llama.h map the rest), linear
// weights [out, in], the vocabulary's tensors with their padded rows (always zero).
//
// Under M-way tensor parallelism (Megatron's split) each rank holds its slice of each tensor as
// its declared Split says: the vocabulary's rows r·Vp/M .. (the embedding and the LM head), a
// column-parallel linear's rows (of each block: GPT-2's c_attn holds q, k and v; by key/value
// head: Llama's k and v), a row-parallel linear's columns, and every other tensor whole. A
// layout with M 1 is the whole model; shard_params/unshard_params map between the two.
// With fewer key/value heads than tensor ranks (M = r·KVH, r > 1: Megatron's rule for
// grouped-query attention) rank t's NH/M query heads all belong to key/value head t / r, and
// it holds that head's d rows of k_proj and of v_proj whole: each such slice is replicated on
// the r consecutive ranks of one head (ParamTensor::replicas, kv_replicas), the first of which
// speaks for it (held_elsewhere); the replicas' gradients are summed over those r ranks.
//
// Under P-stage pipeline parallelism with v chunks per stage (StagePlan), a stage holds the
// layers of its chunks (global chunk g = c·P + stage holds the run of layers after those of
// chunks 0 .. g-1, StagePlan::chunk_layers[g] of them), the embedding on the first stage, the
// head (the final norm and the LM head: tied, the token embedding, held there too) on the last;
// the two copies of a tied embedding get the same gradient, summed over the embedding group.
//
// Under E-way expert parallelism with the experts' weights split (StagePlan::experts > 1;
// docs/ARCHITECTURE.md, "Mixture of experts") expert rank q holds, of every MoE layer, only its
// L = N/E routed experts q·L .. q·L + L - 1 (Split::expert) under their whole-model names, the
// rest of the layer as every rank; the held experts' tensors are one contiguous run
// (expert_runs), at the same offsets on every expert rank, so all ranks' buffers have equal size,
// started and ended at the unit alignment so that it splits evenly over the expert-shard ranks.
// The layer's offsets (LayerTensors) of the experts it does not hold are kNoParam.
//
// Order: the embedding's tensors, then layer by layer (so a stage's chunks are contiguous runs),
// each layer's parts in order (norm1, attention, norm2, MLP), then the head's.
//
// Low-rank adapters (LoRA) have a layout of their own, built by ParamLayout::for_lora from the
// linears the parts declare: for each layer held and each target linear W (out, in), A (r, in)
// then B (out, r), named as W's weight with lora_A / lora_B in place of "weight"
// ("h.3.attn.c_attn.lora_A.weight", llama "layers.3.self_attn.k_proj.lora_A.weight").
// They follow W's split, so that the adapter needs no collective of its own in the forward:
//   column-parallel W (qkv, fc; q, k, v, gate, up)   A replicated, B split like W's rows
//                                                     (k's and v's: by key/value head)
//   row-parallel W (the c_proj's; o, down)           A split by columns like W, B replicated
// Each layer's adapters make one unit; the layout has no embedding and no head.
//
// Units: the runs of tensors that ZeRO-2 reduces and ZeRO-3 gathers as one
// (src/data_parallel/zero_units.h), each named: the embedding (wte and wpe on a single stage; on
// a pipeline each alone, so that the first and the last stage hold the same unit of the tied
// wte), each layer, and the head. With a unit alignment A > 1 each unit starts at a multiple of
// A and the buffer's total is one too (the padding between units is zero and belongs to no
// tensor), so every unit splits evenly over A data-parallel ranks.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "model/model_spec.h"

namespace trident::model {

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
    // E: the ranks the experts' weights are split over (1: every rank holds every expert),
    // and this rank's place among them (see the top of this file).
    int experts = 1;
    int expert_rank = 0;

    ChunkMap map() const { return {placement, stages, chunks}; }
    int global_chunk(int c) const { return map().global(stage, c); }
    // Whether this stage holds the embedding (global chunk 0), and the LM head (the last
    // global chunk): stage P - 1 round robin, stage 0 V-shaped.
    bool first() const { return stage == 0; }
    bool last() const { return map().stage_of(map().last()) == stage; }
};

struct ParamTensor {
    std::string name;                 // e.g. "h.3.attn.c_attn.weight"
    std::vector<int64_t> shape;       // this rank's, e.g. {3H/M, H}
    std::vector<int64_t> full_shape;  // the whole tensor's, e.g. {3H, H}
    std::size_t offset = 0;           // in elements, into the flat buffer
    std::size_t numel = 0;
    Split split;
    Init init = Init::normal;
    bool decay = false;  // weight decay applies (matrices and embeddings)
    bool trains = true;
    // A column split's groups held whole (Split::groups): the consecutive tensor ranks holding
    // the same slice (rank t holds slice t / replicas of M / replicas); else 1.
    int replicas = 1;
};

// The tensor ranks that hold each key/value head's rows: M / KVH when M > KVH, else 1
// (each rank holds KVH / M heads of its own).
int kv_replicas(int kv_heads, int M);

// The offset of a tensor the model does not have (a bias of a linear without one).
inline constexpr std::size_t kNoParam = SIZE_MAX;

// The offsets of one layer's tensors in the flat buffer, part by part (model::LayerPart), each
// in the order its kind declared them.
struct LayerTensors {
    std::array<std::vector<std::size_t>, kLayerParts> parts;
    const std::vector<std::size_t>& of(LayerPart p) const {
        return parts[static_cast<std::size_t>(p)];
    }
};

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

// A unit (see the top of this file): its name ("embedding", "wte", "wpe", "layers.3", "head")
// and its range [begin, end) of the buffer, padding included.
struct Unit {
    std::string name;
    std::size_t begin = 0, end = 0;
};

class ParamLayout {
public:
    // The layout of tensor-parallel rank `tensor_rank` of `M` on the stage `plan`,
    // its units aligned to `unit_align` elements (see the top of this file).
    // Throws trident::Error when heads, ffn or padded_vocab do not divide by M,
    // kv_heads neither divides nor is a multiple of it, model.mlp names no kind, or
    // the chunks' layers do not make the model's (without counts: do not divide by P·v).
    explicit ParamLayout(const GptShape& shape, int tensor_rank = 0, int M = 1,
                         const StagePlan& plan = {}, int unit_align = 1);
    // The layout of the low-rank adapters of that rank's layers (see the top of this file),
    // its units aligned alike. Throws trident::Error for a target no layer has.
    static ParamLayout for_lora(const GptShape& shape, const LoraShape& lora, int tensor_rank = 0,
                                int M = 1, const StagePlan& plan = {}, int unit_align = 1);

    const GptShape& shape() const { return spec_.shape; }
    const ModelSpec& spec() const { return spec_; }
    const std::vector<ParamTensor>& tensors() const { return tensors_; }
    std::size_t total() const { return total_; }  // elements in the flat buffer
    // The units, in buffer order, covering the buffer (padding included).
    const std::vector<Unit>& units() const { return units_; }
    std::vector<std::pair<std::size_t, std::size_t>> unit_ranges() const;
    int tensor_rank() const { return tensor_rank_; }
    int M() const { return M_; }
    const StagePlan& plan() const { return plan_; }
    // Layers of local chunk c, and the global index of its first.
    int chunk_layers(int c) const;
    int first_layer(int c) const;

    // This rank's share of the split dimensions.
    int vocab_begin() const { return tensor_rank_ * vocab_local(); }
    int vocab_local() const { return shape().padded_vocab / M_; }
    int heads_begin() const { return tensor_rank_ * heads_local(); }
    int heads_local() const { return shape().heads / M_; }
    int hidden_local() const { return shape().hidden / M_; }  // attention width
    int ffn_local() const { return shape().ffn / M_; }

    std::size_t wte() const { return wte_; }  // (Vp/M, H), first (and if tied last) stage
    std::size_t wpe() const { return wpe_; }  // (T, H), first stage; kNoParam without one
    // (Vp/M, H) the LM head's weight: wte if tied; last stage.
    std::size_t head() const { return head_; }
    // The final norm's tensors, as its kind declared them; last stage.
    const std::vector<std::size_t>& final_norm() const { return final_norm_; }
    // The ranges [begin, end) of the embedding's tensors (wte, wpe: first stage) and the
    // head's (the final norm, and an untied LM head: last stage).
    std::pair<std::size_t, std::size_t> embedding_range() const { return embedding_range_; }
    std::pair<std::size_t, std::size_t> head_range() const { return head_range_; }
    // The token embedding's tensor name: wte.weight, llama embed_tokens.weight.
    std::string wte_name() const { return spec_.token_embedding + ".weight"; }
    // The tensors of global layer l, which must be one of this stage's, and the range
    // [begin, end) of the flat buffer they fill (a layer's tensors are contiguous).
    const LayerTensors& layer(int l) const;
    std::pair<std::size_t, std::size_t> layer_range(int l) const;
    // An adapters' layout: its rank and targets, and the adapters of global layer l.
    const LoraShape& lora() const { return lora_; }
    const LayerLora& layer_lora(int l) const;

    // The runs [begin, end) of the routed experts this rank holds, one per MoE layer held, in
    // buffer order; none unless the experts are split (StagePlan::experts > 1).
    const std::vector<std::pair<std::size_t, std::size_t>>& expert_runs() const {
        return expert_runs_;
    }
    // Whether t is a routed expert's held by this expert rank alone (the experts split).
    bool split_expert(const ParamTensor& t) const {
        return plan_.experts > 1 && t.split.expert >= 0;
    }
    // Whether t is held alike by every rank of the expert group while the experts are split
    // (every tensor but a routed expert's) and this rank is not expert rank 0, which speaks for
    // it: the whole model takes it from there.
    bool expert_copy_elsewhere(const ParamTensor& t) const {
        return plan_.experts > 1 && t.split.expert < 0 && plan_.expert_rank != 0;
    }

    // The tensor of that name, or nullptr.
    const ParamTensor* find(const std::string& name) const;
    // Whether this rank's copy of t is another rank's too and that rank speaks for it: a
    // replicated tensor off tensor rank 0, a key/value head's rows off the first of its
    // replicas, or the tied wte off the first stage. Norms count,
    // and checkpoints and the whole model take, every element once.
    bool held_elsewhere(const ParamTensor& t) const;

private:
    ParamLayout(const GptShape& shape, const LoraShape* lora, int tensor_rank, int M,
                const StagePlan& plan, int unit_align);
    // Adds a declared tensor, its name given whole (or given apart); returns its offset.
    std::size_t add(const TensorDecl& t);
    std::size_t add(const TensorDecl& t, std::string name);
    // The embedding's tensors (as one unit, or each its own), layer l's or its adapters, and
    // the head's; each unit started at the alignment.
    void add_embedding(bool holds_wte);
    // `decls`: what layer l's parts declare (ModelSpec::layer_decls), alike for a run of
    // layers of the same kinds.
    void add_layer(int l, const std::vector<PartDecl>& decls);
    void add_lora(int l, const LoraShape& lora);
    void add_head();
    // Layer l's run of the experts held starts (`starts`) or ends, at the unit alignment.
    void align_run(bool starts);
    // Whether this rank holds routed expert e of each MoE layer (StagePlan::experts).
    bool holds_expert(int e) const;
    void start_unit(const std::string& name);
    // Global layer l's index among those held.
    std::size_t layer_index(int l) const;

    ModelSpec spec_;
    int tensor_rank_, M_;
    StagePlan plan_;
    std::size_t align_ = 1;
    std::vector<ParamTensor> tensors_;
    std::vector<int> layer_ids_;          // global index of each layer held, ascending
    std::vector<LayerTensors> layers_;    // their tensors (the model's layout)
    std::vector<LayerLora> lora_layers_;  // their adapters (an adapters' layout)
    std::vector<std::pair<std::size_t, std::size_t>> layer_ranges_;
    std::vector<std::pair<std::size_t, std::size_t>> expert_runs_;
    LoraShape lora_;
    std::vector<Unit> units_;
    std::size_t total_ = 0;
    std::pair<std::size_t, std::size_t> embedding_range_, head_range_;
    std::size_t wte_ = 0, wpe_ = kNoParam, head_ = 0;
    std::vector<std::size_t> final_norm_;
};

// Copies this rank's slice of every tensor it holds from `full` (the buffer of a layout of
// the whole model: M 1, one stage) into `local` (the buffer of `local_layout`).
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

// This rank's share of the whole (a buffer of `whole_layout`, the same tensors for M
// 1 and one stage): its parts of `local` in their places, zero elsewhere, each element written
// by exactly one rank of the stage, tensor and expert groups (held_elsewhere,
// expert_copy_elsewhere), so that summing the shares of all ranks gives the whole.
std::vector<float> share_of_whole(const ParamLayout& local_layout, const std::vector<float>& local,
                                  const ParamLayout& whole_layout);

}  // namespace trident::model
