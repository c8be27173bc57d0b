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
// by the stage's chunks, data parallelism by the hooks below, through which the data-parallel
// part (src/data_parallel/) reduces gradients and, at ZeRO-3, gathers parameters.
//
// Low-rank adapters (Lora): the model's own parameters are frozen (no gradient buffer: their
// backward computes only what flows on to the inputs), and each target linear gains an adapter
// (model/lora_adapter.h), its factors in a flat buffer of their own laid out by
// ParamLayout::for_lora, which is what the optimizer trains. Sharded (below), the adapters'
// buffers are sharded as the model's would be, and at ZeRO-3 the frozen parameters too.
//
// ZeRO-2 and ZeRO-3 (Sharding): the gradient buffer, and at ZeRO-3 the parameter buffer too,
// is sharded over the data-parallel replicas (model/flat_buffer.h); a unit of it (the
// embedding, a layer, ln_f) is resident only between the hooks that ask for it and those that
// let it go: the forward asks for each unit's parameters before it reads them and prefetches
// the next unit's, the backward the same in reverse order and asks for each unit's gradients
// before it adds into them, and each piece announces when it is done with them.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "kernels/device_buffer.h"
#include "kernels/ops.h"
#include "model/activation_store.h"
#include "model/flat_buffer.h"
#include "model/param_layout.h"
#include "model/stage_parts.h"
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

// Which of the model's buffers are sharded over the data-parallel replicas (ZeRO-2: the
// gradients; ZeRO-3: the parameters too), and when the gradients of a unit are reduced.
struct Sharding {
    int replica = 0;      // this rank's place in the data-parallel group
    bool grads = false;   // ZeRO-2 and 3
    bool params = false;  // ZeRO-3
    // Gradients reduced into the shard after every microbatch's backward (and the unit
    // released), or kept whole until the step's last microbatch.
    bool every_microbatch = true;
};

struct GptOptions {
    GptShape shape;
    StagePlan plan;       // the pipeline stage held
    int micro_batch = 1;  // sequences of a microbatch
    float dropout = 0;
    bool sequence_parallel = false;
    bool tp_overlap = false;  // parallel.tp_overlap (model/tensor_rows.h)
    ContextMode context_mode = ContextMode::ring;
    Recompute recompute = Recompute::none;
    Precision precision;
    // The parameter and gradient buffers are padded to a multiple of this (the data-parallel
    // group's size, so ZeRO shards them evenly); the padding stays zero. With `sharding` they
    // are sharded over that many replicas, each unit of the layout padded to a multiple of it.
    std::size_t buffer_multiple = 1;
    Sharding sharding;
    Lora lora;
};

// The groups the model's parts exchange over: the tensor group (its split linears, the
// vocab-parallel embedding and loss), the context group (attention over the whole sequence) and
// the ranks of the tensor group sharing a key/value head (its replicas' gradient sum; M > KVH).
struct ModelGroups {
    parallel::Comm& tensor;
    parallel::Comm& context;
    parallel::Comm& kv_replicas;
};

class Gpt {
public:
    Gpt(kernels::Ops& ops, const GptOptions& options, const ModelGroups& groups);

    const ParamLayout& layout() const { return layout_; }  // this rank's part
    const GptShape& shape() const { return layout_.shape(); }
    const GptOptions& options() const { return options_; }
    int micro_batch() const { return d_.B; }
    // Tokens of each sequence on this rank: seq_len / C (context parallelism).
    int local_tokens() const { return d_.T; }
    // Elements of the activation a chunk passes on: its rows of the residual stream (R, H), of
    // precision().activations.
    std::size_t boundary_size() const { return d_.rows_mine() * static_cast<std::size_t>(d_.H); }
    const Precision& precision() const { return options_.precision; }
    const Sharding& sharding() const { return options_.sharding; }
    FlatBuffer& params() { return weights_.params; }
    FlatBuffer& grads() { return weights_.grads; }
    const FlatBuffer& params() const { return weights_.params; }
    const FlatBuffer& grads() const { return weights_.grads; }
    // Held always: the whole buffers, or the shards.
    std::size_t params_bytes() const { return weights_.params.bytes(); }
    std::size_t grads_bytes() const { return weights_.grads.bytes(); }

    // ---- low-rank adapters ------------------------------------------------------------------
    // Whether the model is frozen under adapters, and their layout (this rank's part), options,
    // parameters and gradients (empty without adapters).
    bool frozen() const { return weights_.frozen; }
    const Lora& lora() const { return options_.lora; }
    const ParamLayout& lora_layout() const { return lora_layout_; }
    FlatBuffer& lora_params() { return weights_.lora_params; }
    FlatBuffer& lora_grads() { return weights_.lora_grads; }
    const FlatBuffer& lora_params() const { return weights_.lora_params; }
    const FlatBuffer& lora_grads() const { return weights_.lora_grads; }
    // What trains: the adapters of a frozen model, else the model's parameters.
    const ParamLayout& trainable_layout() const { return frozen() ? lora_layout_ : layout_; }
    FlatBuffer& trainable_params() { return frozen() ? lora_params() : params(); }
    FlatBuffer& trainable_grads() { return frozen() ? lora_grads() : grads(); }
    const FlatBuffer& trainable_params() const { return frozen() ? lora_params() : params(); }

    // ---- parameters on the host (model/gpt_params.cpp) ----------------------------------------
    // GPT-2 initialisation of the whole model, a pure function of (seed, tensor, element) so
    // every split gets the same model: normal(0, init_std) for matrices and embeddings,
    // init_std/sqrt(2*layers) for the residual output projections (GPT-2's only), zero
    // biases, unit norm gains; padded vocabulary rows zero.
    void init_random(uint64_t seed, float init_std);
    // This rank's part, as laid out by layout(). Sharded, what this replica holds: loaded
    // from its parts of `local`, and returned in their places with zeros elsewhere (the
    // gradients: the shard the reduction filled).
    void load_params(const std::vector<float>& local);
    std::vector<float> params_to_host() const;
    std::vector<float> grads_to_host() const;
    // The whole model (a buffer of ParamLayout(shape())): load this rank's part of it.
    void load_full_params(const std::vector<float>& full);
    // This rank's share of the whole model: its parts in their places, zero elsewhere, and
    // each element written by exactly one rank of the stage and tensor groups (replicated
    // tensors by tensor rank 0, wte by the first stage), so summing the shares of all ranks
    // gives the whole model.
    std::vector<float> share_of_full(const std::vector<float>& local) const;
    // The same for the adapters (local: as lora_layout() lays them out; full: a buffer of
    // ParamLayout::for_lora(shape(), lora().shape)).
    std::vector<float> lora_to_host() const;
    std::vector<float> lora_grads_to_host() const;
    void load_lora(const std::vector<float>& local);
    void load_full_lora(const std::vector<float>& full);
    std::vector<float> lora_share_of_full(const std::vector<float>& local) const;

    // ---- the pipeline's unit of work: local chunk c on microbatch mb -----------------------
    // Forward. The chunk's input is the embedding of `inputs` (B, T) if it is the first
    // global chunk, else `input` (R, H) as the previous chunk sent it (copied). The last
    // global chunk computes the loss against `targets` (B, T) and adds its mean over the B*T
    // tokens to the loss sum on the device (take_loss_sum); other chunks write their output
    // (R, H) to `output`. Token ids are on the host; T is local_tokens(). Without `training`
    // (no dropout) the activations are released at once.
    void forward_chunk(int mb, int c, const int32_t* inputs, const int32_t* targets,
                       kernels::ConstPtr input, kernels::Ptr output, bool training,
                       uint64_t dropout_seed);
    // The sum of the mean losses the forwards added since the last call, read from the device
    // once (the one wait for it that the loss costs), and the sum started again at 0.
    double take_loss_sum();
    // Backward of that forward. The last global chunk starts from its loss, each token
    // weighted by dloss; other chunks from `output_grad` (R, H). Writes the gradient of the
    // chunk's input to `input_grad` (R, H) unless the chunk starts with the embedding.
    // `last`: the chunk's last backward of the step. Its gradients are then complete, layer
    // by layer: the parts sum their partial gradients over the tensor group, and each range is
    // announced (StepHooks::grads_final).
    void backward_chunk(int mb, int c, float dloss, kernels::ConstPtr output_grad,
                        kernels::Ptr input_grad, bool last);
    // The same backward in two parts (zero-bubble schedules, pipeline/schedule.h): B, the
    // gradient of the chunk's input, keeping the gradients of the outputs of every
    // parameterised part; then W, the parameters' gradients from those, which frees the
    // activations. B then W adds into the gradient buffer exactly what backward_chunk adds.
    // Needs set_split_backward(true) before the first forward.
    void backward_input(int mb, int c, float dloss, kernels::ConstPtr output_grad,
                        kernels::Ptr input_grad);
    void backward_weight(int mb, int c, bool last);
    void set_split_backward(bool on);
    bool split_backward() const { return store_.policy().split_backward; }
    // The next-token logits (V) at `position` of the first sequence of `inputs` (B, T), with
    // no loss and no dropout: the full-context rerun that generation's cached decoder
    // (model/decoder.h) is tested against. Needs the whole model in this process.
    std::vector<float> logits_at(const int32_t* inputs, int position);
    void zero_grads();

    // What the data-parallel part learns during a step, as ranges [begin, end) of the flat
    // buffers: the gradients of a range are final (nothing more will be added until they are
    // reduced: the reduction of a bucket may start), or the parameters of a range are about to
    // be read (the parameters' gather of a bucket must have completed). The tied wte of a
    // model cut into stages is final only once the trainer has summed its two copies; it says
    // so (with sharded gradients the copies are summed on the shards after the reduction, and
    // the model announces wte as any other unit). Sharded buffers also learn which parameters
    // will be read next (prefetch), which are no longer needed (done), and which gradients are
    // about to be added into (needed).
    struct StepHooks {
        std::function<void(std::size_t begin, std::size_t end)> grads_final;
        std::function<void(std::size_t begin, std::size_t end)> params_needed;
        std::function<void(std::size_t begin, std::size_t end)> params_prefetch;
        std::function<void(std::size_t begin, std::size_t end)> params_done;
        std::function<void(std::size_t begin, std::size_t end)> grads_needed;
        // A frozen model's own parameters (in its buffer; the hooks above then speak of the
        // adapters' buffer): needed, next, done, as above (ZeRO-3 shards them too).
        std::function<void(std::size_t begin, std::size_t end)> frozen_needed;
        std::function<void(std::size_t begin, std::size_t end)> frozen_prefetch;
        std::function<void(std::size_t begin, std::size_t end)> frozen_done;
    };
    void set_hooks(const StepHooks& hooks) { hooks_ = hooks; }
    // Where the pieces of tp_overlap's exchanges are reported (model/tensor_rows.h).
    void set_piece_trace(std::function<void(const PieceSpan&)> trace) {
        rows_.set_trace(std::move(trace));
    }
    // Activation sets allocated so far: the most (microbatch, chunk) pairs ever in flight,
    // and their bytes (what recompute keeps; its one shared scratch set is not counted here,
    // only in the allocator's peak).
    std::size_t activation_sets() const { return store_.sets(); }
    std::size_t activation_bytes() const { return store_.bytes(); }
    Recompute recompute() const { return options_.recompute; }

private:
    using Range = std::pair<std::size_t, std::size_t>;
    using Set = ActivationStore::Set;

    bool embeds(int c) const { return layout_.plan().global_chunk(c) == 0; }
    bool has_head(int c) const;
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
    void layer_backward(int c, Set& set, int i, BackwardPart part, bool reduce);
    void embedding_backward(Set& set, BackwardPart part, bool reduce);

    // The hooks, and the ranges they speak of.
    bool reads_params_in(BackwardPart part) const;  // this part of a backward reads weights
    void params_needed(Range r) const;
    void params_prefetch(Range r) const;
    void params_done(Range r) const;
    void grads_needed(Range r) const;
    void grads_final(Range r) const;
    Range embedding_range() const;
    Range lnf_range() const;
    Range wte_range() const;
    // The parameters read after layer i of local chunk c's forward (the next layer's, or the
    // head's ln_f) and before it in its backward (the previous layer's); empty if none.
    Range next_in_forward(int c, int i) const;
    Range next_in_backward(int c, int i) const;
    // The adapters' range (lora_layout()) of the layers whose parameters lie in r; empty if
    // none.
    Range adapters_of(Range r) const;

    kernels::Ops& ops_;
    GptOptions options_;
    ParamLayout layout_, lora_layout_;
    Dims d_;
    TensorRows rows_;
    Weights weights_;
    StageParts parts_;
    Scratch scratch_;
    PartContext ctx_;
    ActivationStore store_;
    kernels::DeviceBuffer loss_sum_;  // (1) f64: the microbatches' mean losses, until taken
    StepHooks hooks_;
};

}  // namespace trident::model
