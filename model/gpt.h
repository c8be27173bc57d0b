// The model (GPT-2's or Llama's layers) on one rank: a pipeline stage's parts (model/stage_parts.h:
// embedding + chunks of transformer layers + LM head and loss) over this rank's tensor-parallel
// slice and context-parallel tokens, its parameter and gradient buffers, and the activations of the
// (microbatch, chunk) pairs in flight (model/activation_store.h). It runs one chunk on one
// microbatch at a time, in the order a pipeline schedule gives (src/pipeline/executor.h).
//
// Parameters and gradients each live in one flat buffer laid out by ParamLayout. Backward
// ADDS into the gradient buffer, so gradient accumulation over microbatches is calling
// forward/backward repeatedly with dloss = 1 / (tokens in the global batch).
//
// Parallelism is applied from outside the parts (docs/ARCHITECTURE.md): tensor parallelism by
// the split linears (model/linear.h) over the tensor group, sequence parallelism by the rows
// each rank holds (model/tensor_rows.h), context parallelism by the attention core
// (model/context_attention.h) and the tokens the trainer gives each rank, pipeline parallelism
// by the stage's chunks, data parallelism by the data-parallel module (src/data_parallel/), to
// which the model shows its units and the events of a step on them (model/model_units.h).
//
// Low-rank adapters (Lora): the model's own parameters are frozen (no gradient buffer: their
// backward computes only what flows on to the inputs), and each target linear gains an adapter
// (model/lora_adapter.h), its factors in a flat buffer of their own laid out by
// ParamLayout::for_lora, which is what the optimizer trains. Sharded (below), the adapters'
// buffers are sharded as the model's would be, and at ZeRO-3 the frozen parameters too.
//
// The buffers are held as the data-parallel module's BufferPlan says: whole, or cut into the
// layout's units and sharded (model/flat_buffer.h), a unit resident only while the module holds
// it; the model announces each unit it is about to read or add into, and each whose gradients
// are complete (UnitListener), and never asks why.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "kernels/device_buffer.h"
#include "kernels/ops.h"
#include "model/activation_store.h"
#include "model/documents.h"
#include "model/flat_buffer.h"
#include "model/model_units.h"
#include "model/nf4_base.h"
#include "model/param_layout.h"
#include "model/stage_parts.h"
#include "model/weight_set.h"
#include "parallel/comm.h"

namespace trident::model {

// Element types of the model's buffers: fp32 throughout, or mixed precision (16-bit
// parameters and activations; gradients 16-bit too, or fp32 to accumulate and reduce them
// in fp32). Norm statistics and the loss are fp32 either way.
struct Precision {
    kernels::DType params = kernels::DType::f32;
    kernels::DType grads = kernels::DType::f32;
    kernels::DType activations = kernels::DType::f32;
};

struct GptOptions {
    GptShape shape;
    StagePlan plan;       // the pipeline stage held
    int micro_batch = 1;  // sequences of a microbatch
    float dropout = 0;
    bool sequence_parallel = false;
    bool tp_overlap = false;  // parallel.tp_overlap (model/tensor_rows.h)
    // parallel.ep_overlap: an attention's weight gradients under the next MoE layer's
    // backward dispatch (model/part_context.h, Deferred).
    bool ep_overlap = false;
    ContextMode context_mode = ContextMode::ring;
    Recompute recompute = Recompute::none;
    // A split backward: B and W apart (zero-bubble schedules, pipeline/schedule.h).
    bool split_backward = false;
    Precision precision;
    BufferPlan buffers;  // the data-parallel module's (model/model_units.h)
    Lora lora;
    DocumentOptions documents;  // data.documents, eod_token, mask_eod_loss
};

// The groups the model's parts exchange over: the tensor group (its split linears, the
// vocab-parallel embedding and loss), the context group (attention over the whole sequence) and
// the ranks of the tensor group sharing a key/value head (its replicas' gradient sum; M > KVH).
struct ModelGroups {
    parallel::Comm& tensor;
    parallel::Comm& context;
    parallel::Comm& kv_replicas;
    // The expert group (expert parallelism: the ranks splitting each MoE layer's experts); none:
    // every rank computes every expert.
    parallel::Comm* experts = nullptr;
};

// Activation sets allocated so far: the most (microbatch, chunk) pairs ever in flight, and
// their bytes (what recompute keeps; its one shared scratch set is not counted here, only in
// the allocator's peak).
struct ActivationUse {
    std::size_t sets = 0, bytes = 0;
};

class Gpt {
public:
    Gpt(kernels::Ops& ops, const GptOptions& options, const ModelGroups& groups);

    const GptOptions& options() const { return options_; }
    const ParamLayout& layout() const { return layout_; }  // this rank's part
    // The model's own weights, its adapters' (empty without adapters) and what trains: the
    // adapters of a model frozen under them, else its own (model/weight_set.h).
    WeightSet& weights() { return own_; }
    const WeightSet& weights() const { return own_; }
    // The 4-bit base (options().lora.quant_block > 0), or null. quantize_base quantizes it from
    // the whole model's weights (a buffer of weights().whole()), after they are loaded.
    const Nf4Base* nf4_base() const { return nf4_.get(); }
    Nf4Base* nf4_base() { return nf4_.get(); }
    void quantize_base(const std::vector<float>& whole);
    WeightSet& adapters() { return adapters_; }
    const WeightSet& adapters() const { return adapters_; }
    WeightSet& trainable() { return frozen() ? adapters_ : own_; }
    const WeightSet& trainable() const { return frozen() ? adapters_ : own_; }
    bool frozen() const { return weights_.frozen; }

    // The units and their events (model/model_units.h); without a listener nothing is told.
    const std::vector<ModelUnit>& units() const { return units_; }
    void set_listener(UnitListener* listener) { listener_ = listener; }
    // Where the pieces of tp_overlap's exchanges are reported (model/tensor_rows.h).
    void set_piece_trace(std::function<void(const PieceSpan&)> trace) {
        rows_.set_trace(std::move(trace));
    }

    // Tokens of each sequence on this rank: seq_len / C (context parallelism).
    int local_tokens() const { return d_.T; }
    // Elements of the activation a chunk passes on: its rows of the residual stream (R, H), of
    // options().precision.activations.
    std::size_t boundary_size() const { return d_.rows_mine() * static_cast<std::size_t>(d_.H); }

    // ---- the pipeline's unit of work: local chunk c on microbatch mb -----------------------
    // Forward. The chunk's input is the embedding of `inputs` (B, T) if it is the first
    // global chunk, else `input` (R, H) as the previous chunk sent it (copied). The last
    // global chunk computes the loss against `targets` (B, T) and adds its mean over the B*T
    // tokens to the loss sum on the device (take_loss_sum); other chunks write their output
    // (R, H) to `output`. Token ids are on the host; T is local_tokens(). Without `training`
    // (no dropout) the activations are released at once. Under data.documents: mask every chunk
    // reads `inputs` (its attention keeps within the documents), and under mask_eod_loss the
    // last one does.
    void forward_chunk(int mb, int c, const int32_t* inputs, const int32_t* targets,
                       kernels::ConstPtr input, kernels::Ptr output, bool training,
                       uint64_t dropout_seed);
    // The sum of the mean losses the forwards added since the last call, read from the device
    // once (the one wait for it that the loss costs), and the sum started again at 0.
    double take_loss_sum();
    // The mixture of experts' losses of the training forwards since the last call (0 without).
    MoeLossSums take_moe_losses() { return std::exchange(moe_losses_, {}); }
    // Backward of that forward. The last global chunk starts from its loss, each token
    // weighted by dloss; other chunks from `output_grad` (R, H). Writes the gradient of the
    // chunk's input to `input_grad` (R, H) unless the chunk starts with the embedding.
    // `last`: the chunk's last backward of the step. Its gradients are then complete, layer
    // by layer: the parts sum their partial gradients over the tensor group, and each unit is
    // announced (UnitListener::grads_complete); with BufferPlan::grads_every_microbatch,
    // after every backward.
    void backward_chunk(int mb, int c, float dloss, kernels::ConstPtr output_grad,
                        kernels::Ptr input_grad, bool last);
    // The same backward in two parts (zero-bubble schedules, pipeline/schedule.h): B, the
    // gradient of the chunk's input, keeping the gradients of the outputs of every
    // parameterised part; then W, the parameters' gradients from those, which frees the
    // activations. B then W adds into the gradient buffer exactly what backward_chunk adds.
    // Needs options().split_backward.
    void backward_input(int mb, int c, float dloss, kernels::ConstPtr output_grad,
                        kernels::Ptr input_grad);
    void backward_weight(int mb, int c, bool last);
    // The next-token logits (V) at `position` of the first sequence of `inputs` (B, T), with
    // no loss and no dropout: the full-context rerun that generation's cached decoder
    // (model/decoder.h) is tested against. Needs the whole model in this process.
    std::vector<float> logits_at(const int32_t* inputs, int position);
    // The activation sets allocated so far (ActivationUse).
    ActivationUse activations() const { return {store_.sets(), store_.bytes()}; }

private:
    using Range = std::pair<std::size_t, std::size_t>;
    using Set = ActivationStore::Set;

    bool embeds(int c) const { return layout_.plan().global_chunk(c) == 0; }
    bool has_head(int c) const;
    // A pass of the set's microbatch through `layer` (-1 the embedding, L the head), with its
    // documents when the model reads them.
    Pass pass_of(const Set& set, const SetBuffers& buffers, int layer) const;
    // The microbatch's documents from its input tokens (B, T), when the model reads them.
    void find_documents(int c, Set& set, const int32_t* inputs);
    // The chunk's layers, embedding and head (forward), given its set.
    void run_forward(int c, Set& set, const int32_t* inputs, kernels::ConstPtr input);
    // The chunk's input (R, H) in its set, and layer i's input: the previous one's output.
    kernels::Ptr chunk_input(int c, const Set& set) const;
    kernels::ConstPtr layer_input(int c, const Set& set, int i) const;
    kernels::ConstPtr chunk_output(int c, const Set& set) const;
    void backward_part(int mb, int c, float dloss, kernels::ConstPtr output_grad,
                       kernels::Ptr input_grad, BackwardPart part, bool last);
    // Backward, piece by piece, each adding into d_residual, the gradient of this rank's rows
    // of the residual stream (B), and into the gradient buffers (W).
    void head_backward(int c, Set& set, float dloss, BackwardPart part, bool reduce);
    void layer_backward(int c, Set& set, int i, float dloss, BackwardPart part, bool reduce);
    // parallel.ep_overlap: whether layer i of chunk c leaves its attention's weight gradients
    // to the layer below's exchange (a plain backward, that layer an exchanging MoE layer).
    bool defers_attention(int c, int i, BackwardPart part) const;
    // Layer i's attention weight gradients and what then completes its gradients, deferred.
    void defer_attention(int c, Set& set, int i, bool reduce);
    // The end of layer i's gradients: partial sums finished and the unit announced.
    void layer_grads_done(int c, int i);
    void embedding_backward(Set& set, BackwardPart part, bool reduce);

    // The units (units()) by index, and the events on them (UnitListener), told where there is
    // a unit and a listener.
    using Unit = std::size_t;
    static constexpr Unit kNone = SIZE_MAX;
    bool reads_params_in(BackwardPart part) const;  // this part of a backward reads weights
    void params_needed(Unit u, Unit next = kNone) const;
    void params_done(Unit u) const;
    void grads_needed(Unit u) const;
    void grads_complete(Unit u) const;
    // The head's units, the final norm's and the tied embedding's (which it reads): needed,
    // `next` read after them; done.
    void head_needed(Unit next) const;
    void head_done() const;
    Unit layer_unit(int l) const;
    // The unit read after layer i of local chunk c's forward (the next layer's, or the head's)
    // and before it in its backward (the previous layer's); kNone if none.
    Unit next_in_forward(int c, int i) const;
    Unit next_in_backward(int c, int i) const;

    kernels::Ops& ops_;
    GptOptions options_;
    ParamLayout layout_, lora_layout_;
    Dims d_;
    TensorRows rows_;
    Weights weights_;
    WeightSet own_, adapters_;
    std::unique_ptr<Nf4Base> nf4_;  // the layers' GEMM policy with a 4-bit base
    StageParts parts_;
    Scratch scratch_;
    MoeLossSums moe_losses_;
    Deferred deferred_;  // the attention weight gradients waiting for an exchange
    PartContext ctx_;
    ActivationStore store_;
    kernels::DeviceBuffer loss_sum_;  // (1) f64: the microbatches' mean losses, until taken
    std::vector<ModelUnit> units_;
    std::vector<Unit> embedding_units_;          // this stage's embedding's: one, or wte and wpe
    Unit head_unit_ = kNone, wte_unit_ = kNone;  // the head's; the token embedding's (if held)
    UnitListener* listener_ = nullptr;
};

}  // namespace trident::model
