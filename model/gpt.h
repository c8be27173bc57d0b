// The GPT-2 model: parameters, activations, and the hand-written forward and backward passes
// for one microbatch, composed from the ops of kernels/ops.h.
//
// Parameters and gradients each live in one flat buffer laid out by ParamLayout. Backward
// ADDS into the gradient buffer, so gradient accumulation over microbatches is just calling
// forward/backward repeatedly with dloss = 1 / (tokens in the global batch).
//
// Tensor parallelism (Megatron): over the `tensor` group of M ranks, attention is split by
// heads and the MLP by columns then rows; f (identity forward, all-reduce backward) stands
// before each column-parallel layer and g (all-reduce forward, identity backward) after each
// row-parallel one, so 4 all-reduces of (B,T,C) per layer per microbatch; the embedding and
// the LM head are vocab-parallel and the loss never gathers the logits. With
// sequence_parallel the residual stream (LayerNorm, dropout, residual adds) is split by rows
// of (B*T): all-gather before a column-parallel layer, reduce-scatter after a row-parallel
// one. With M = 1 the same code runs and every collective returns at once.
//
// Pipeline parallelism: a Gpt holds one stage (StagePlan): v chunks of contiguous layers,
// the embedding on the first stage and the LM head and loss on the last. The executor runs
// forward_chunk/backward_chunk per (microbatch, chunk) in a schedule's order; each in-flight
// pair keeps its own activations, returned to a pool by its backward.
//
// Context parallelism: over the `context` group of C ranks, each rank holds T/C tokens of
// every sequence (two chunks, model/context_split.h) through the whole stage: LayerNorms,
// the MLP, the embedding (at the tokens' positions) and the loss work on the local tokens;
// attention sees the whole sequence by ring attention or Ulysses (model/context_attention.h).
// The gradients are this rank's part: the trainer sums them over the data-context group.
//
// Activation recompute (Korthikanti et al., "Reducing Activation Recomputation in Large
// Transformer Models") trades FLOPs for the memory of the sets in flight. selective keeps all
// but what attention keeps for its backward (on the CPU the probabilities (B,NH/M,T,T), the
// 5·a·s/h term; a backend chooses, see Ops::attention_saved), and rebuilds it from qkv
// before attention's backward. full keeps only each layer's output (R,C) (so every layer's
// input) and reruns each layer's forward, collectives included, just before its backward.
// Both rebuild into one scratch set shared by every (microbatch, chunk), and the kernels and
// dropout masks are deterministic, so the gradients are bitwise those without recompute.
//
// Low-rank adapters (Adapters; Hu et al., "LoRA: Low-Rank Adaptation of Large Language
// Models", 2021): the model's own parameters are frozen (no gradient buffer: their backward
// computes only what flows on to the inputs), and each target linear y = x·W^T of every layer
// gains s·(drop(x)·A^T)·B^T, s = alpha / r, its factors in a flat buffer of their own laid out
// by ParamLayout::adapters, which is what the optimizer trains. A follows W's split, so the
// forward needs no collective beyond the layer's own; the replicated factor's gradient (A of
// a column-parallel linear, B of a row-parallel one) is then a partial sum on each tensor
// rank, summed over the tensor group once per step, with the layer's last backward.
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
#include <initializer_list>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/ops.h"
#include "model/context_attention.h"
#include "model/device_buffer.h"
#include "model/flat_buffer.h"
#include "model/param_layout.h"
#include "parallel/comm.h"
#include "parallel/solo_comm.h"

namespace trident::model {

enum class Recompute { none, selective, full };

// The context-parallel group of ranks that split each sequence (null: not split), and how
// attention sees the whole sequence.
struct ContextSplit {
    parallel::Comm* group = nullptr;
    ContextMode mode = ContextMode::ring;
};

// Element types of the model's buffers: fp32 throughout, or mixed precision (16-bit
// parameters and activations; gradients 16-bit too, or fp32 to accumulate and reduce them
// in fp32). LayerNorm statistics and the loss are fp32 either way.
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

// Low-rank adapters (see the top of this file): which linears carry them and their rank
// (rank 0: none, every parameter trains), the scale alpha / r of B·A, and the dropout on
// the adapters' input.
struct Adapters {
    LoraShape shape;
    float scale = 0;
    float dropout = 0;
};

class Gpt {
public:
    // micro_batch x seq_len / C is the shape of every microbatch this model will run (C the
    // context group's size). `tensor` is the tensor-parallel group (null: not split); `plan`
    // the pipeline stage held.
    // The parameter and gradient buffers are padded to a multiple of `buffer_multiple` (the
    // data-parallel size, so ZeRO shards them evenly); the padding stays zero. With
    // `sharding` they are sharded over that many replicas, each unit of the layout padded to
    // a multiple of it.
    Gpt(kernels::Ops& ops, const GptShape& shape, int micro_batch, float dropout,
        parallel::Comm* tensor = nullptr, bool sequence_parallel = false,
        const StagePlan& plan = {}, std::size_t buffer_multiple = 1,
        Recompute recompute = Recompute::none, const Precision& precision = {},
        const Sharding& sharding = {}, const ContextSplit& context = {},
        const Adapters& adapters = {});
    ~Gpt();

    const ParamLayout& layout() const { return layout_; }  // this rank's part
    const GptShape& shape() const { return layout_.shape(); }
    int micro_batch() const { return B_; }
    // Tokens of each sequence on this rank: seq_len / C.
    int local_tokens() const { return T_; }
    // Elements of the activation a chunk passes on: its rows of the residual stream (R, C),
    // of precision().activations.
    std::size_t boundary_size() const {
        return static_cast<std::size_t>(rows_mine_) * layout_.shape().hidden;
    }
    const Precision& precision() const { return precision_; }
    const Sharding& sharding() const { return sharding_; }
    FlatBuffer& params() { return params_; }
    FlatBuffer& grads() { return grads_; }
    const FlatBuffer& params() const { return params_; }
    const FlatBuffer& grads() const { return grads_; }
    std::size_t buffer_size() const { return params_.size(); }  // layout total, padded
    // Held always: the whole buffers, or the shards.
    std::size_t params_bytes() const { return params_.bytes(); }
    std::size_t grads_bytes() const { return grads_.bytes(); }

    // ---- low-rank adapters ------------------------------------------------------------------
    // Whether the model is frozen under adapters, and their layout (this rank's part), scale,
    // parameters and gradients (empty without adapters).
    bool frozen() const { return adapters_.shape.rank > 0; }
    const Adapters& adapters() const { return adapters_; }
    const ParamLayout& adapter_layout() const { return adapter_layout_; }
    FlatBuffer& adapter_params() { return adapter_params_; }
    FlatBuffer& adapter_grads() { return adapter_grads_; }
    const FlatBuffer& adapter_params() const { return adapter_params_; }
    const FlatBuffer& adapter_grads() const { return adapter_grads_; }
    // What trains: the adapters of a frozen model, else the model's parameters.
    const ParamLayout& trainable_layout() const { return frozen() ? adapter_layout_ : layout_; }
    FlatBuffer& trainable_params() { return frozen() ? adapter_params_ : params_; }
    FlatBuffer& trainable_grads() { return frozen() ? adapter_grads_ : grads_; }
    const FlatBuffer& trainable_params() const { return frozen() ? adapter_params_ : params_; }
    // The adapters as adapter_layout() lays them out, to and from the host; and from all of
    // them (a buffer of ParamLayout::adapters(shape(), adapters().shape)).
    std::vector<float> adapters_to_host() const;
    std::vector<float> adapter_grads_to_host() const;
    void load_adapters(const std::vector<float>& local);
    void load_full_adapters(const std::vector<float>& full);

    // GPT-2 initialisation of the whole model, a pure function of (seed, tensor, element) so
    // every split gets the same model: normal(0, init_std) for matrices and embeddings,
    // init_std/sqrt(2*layers) for the residual output projections, zero biases, unit
    // LayerNorm gains; padded vocabulary rows zero.
    void init_random(uint64_t seed, float init_std);
    // This rank's part, as laid out by layout(). Sharded, what this replica holds: loaded
    // from its parts of `local`, and returned in their places with zeros elsewhere (the
    // gradients: the shard the optimizer's reduction filled).
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
    // The same for the adapters (local: as adapter_layout() lays them out).
    std::vector<float> adapter_share_of_full(const std::vector<float>& local) const;

    // ---- the pipeline's unit of work: local chunk c on microbatch mb -----------------------
    // Forward. The chunk's input is the embedding of `inputs` (B, T) if it is the first
    // global chunk, else `input` (R, C) as the previous chunk sent it (copied). The last
    // global chunk computes the loss against `targets` (B, T) and adds its mean over the B*T
    // tokens to the loss sum on the device (take_loss_sum); other chunks write their output
    // (R, C) to `output`. Token ids are on the host; T is local_tokens(), this rank's tokens
    // of each sequence. Without `training` (no dropout) the activations are released at once.
    void forward_chunk(int mb, int c, const int32_t* inputs, const int32_t* targets,
                       kernels::ConstPtr input, kernels::Ptr output, bool training,
                       uint64_t dropout_seed);
    // The sum of the mean losses the forwards added since the last call, read from the device
    // once (the one wait for it that the loss costs), and the sum started again at 0.
    double take_loss_sum();
    // Backward of that forward. The last global chunk starts from its loss, each token
    // weighted by dloss; other chunks from `output_grad` (R, C). Writes the gradient of the
    // chunk's input to `input_grad` (R, C) unless the chunk starts with the embedding.
    // `last`: the chunk's last backward of the step. Its gradients are then complete, layer
    // by layer: with sequence parallelism the LayerNorm gradients (partial sums over each
    // rank's rows) are summed over the tensor group, and each range is announced
    // (StepHooks::grads_final).
    void backward_chunk(int mb, int c, float dloss, kernels::ConstPtr output_grad,
                        kernels::Ptr input_grad, bool last);
    // The same backward in two parts (zero-bubble schedules, pipeline/schedule.h): B, the
    // gradient of the chunk's input (and everything up to it), keeping the gradients of the
    // outputs of every parameterised op; then W, the parameters' gradients from those, which
    // frees the activations. B then W adds into the gradient buffer exactly what
    // backward_chunk adds. Needs set_split_backward(true) before the first forward (each
    // activation set then holds what B keeps for W).
    void backward_input(int mb, int c, float dloss, kernels::ConstPtr output_grad,
                        kernels::Ptr input_grad);
    void backward_weight(int mb, int c, bool last);
    void set_split_backward(bool on);
    bool split_backward() const { return split_backward_; }
    // The next-token logits (V) at `position` of the first sequence of `inputs` (B, T), for
    // generation: no loss, no dropout. Needs the whole model in this process.
    std::vector<float> logits_at(const int32_t* inputs, int position);
    void zero_grads();

    // What the optimizer learns during a step, as ranges [begin, end) of the flat buffers:
    // the gradients of a range are final (nothing more will be added until they are reduced:
    // the data-parallel reduction of a bucket may start), or the parameters of a range are
    // about to be read (the parameters' gather of a bucket must have completed). The tied
    // wte of a model cut into stages is final only once the trainer has summed its two
    // copies; it says so (with sharded gradients the copies are summed on the shards after
    // the reduction, and the model announces wte as any other unit). Sharded buffers also
    // learn which parameters will be read next (prefetch), which are no longer needed
    // (done), and which gradients are about to be added into (needed).
    struct StepHooks {
        std::function<void(std::size_t begin, std::size_t end)> grads_final;
        std::function<void(std::size_t begin, std::size_t end)> params_needed;
        std::function<void(std::size_t begin, std::size_t end)> params_prefetch;
        std::function<void(std::size_t begin, std::size_t end)> params_done;
        std::function<void(std::size_t begin, std::size_t end)> grads_needed;
    };
    void set_hooks(const StepHooks& hooks) { hooks_ = hooks; }
    // Activation sets allocated so far: the most (microbatch, chunk) pairs ever in flight,
    // and their bytes (what recompute keeps; its one shared scratch set is not counted here,
    // only in the allocator's peak).
    std::size_t activation_sets() const;
    std::size_t activation_bytes() const { return activation_bytes_; }  // as allocated
    Recompute recompute() const { return recompute_; }

private:
    struct LayerActivations;
    struct Activations;  // one (microbatch, chunk) in flight

    std::unique_ptr<Activations> new_activations(int c);
    // Whether each layer's set keeps what attention keeps for backward: without recompute,
    // and under selective recompute with ring attention, whose log-sum-exp is as small as
    // anything recompute would keep instead (full recompute keeps nothing of a layer).
    bool keeps_attention() const {
        return recompute_ == Recompute::none || (recompute_ == Recompute::selective && context_ &&
                                                 context_->mode() == ContextMode::ring);
    }
    // Allocates the buffers of one layer's set: `work` the intermediates backward reads (all
    // but att and the output), `att` what attention keeps for backward, `output` resid3.
    void allocate_layer(LayerActivations& la, bool work, bool att, bool output);
    Activations& start(int mb, int c);
    Activations& live(int mb, int c);
    void release(int mb, int c);
    // The chunk's layers, embedding and head (forward), given its activations.
    void run_forward(int c, Activations& a, const int32_t* inputs, kernels::ConstPtr input);
    // Layer l on this rank's rows `residual` (R,C): intermediates into `la`, the attention
    // probabilities into `att`, the layer's output into `output` (R,C). A null output stops
    // after the MLP's GELU, which is all backward reads (full recompute).
    void forward_layer(const Activations& a, int l, LayerActivations& la, kernels::Ptr att,
                       kernels::ConstPtr residual, kernels::Ptr output);
    // The loss of the last chunk's logits: fills a.losses and a.lse; adds the mean to
    // loss_sum_.
    void loss(Activations& a, const int32_t* targets);
    // Which gradients a backward computes: all, the inputs' (B) or the parameters' (W).
    enum class Part { both, input, weight };
    void backward_part(int mb, int c, float dloss, kernels::ConstPtr output_grad,
                       kernels::Ptr input_grad, Part part, bool last);
    // Backward, piece by piece, each adding into dresidual_ (R,C), the gradient of this
    // rank's rows of the residual stream (B), and into the gradient buffer (W). The loss,
    // the LM head and ln_f: sets dresidual_.
    void head_backward(Activations& a, float dloss, Part part);
    // Layer l, the mirror of forward_layer: `kept` its activations, `residual` its input
    // (R,C).
    void backward_layer(const Activations& a, int l, LayerActivations& kept,
                        kernels::ConstPtr residual, Part part);
    // The embedding (first global chunk): dresidual_ into wte's and wpe's gradients.
    void embedding_backward(Activations& a, Part part);
    // After a chunk's last backward of a step: sums the LayerNorm gradients of [begin, end)
    // over the tensor group (sequence parallelism: each rank saw its rows only), then
    // announces the range final.
    void gradients_final(std::size_t begin, std::size_t end,
                         std::initializer_list<std::size_t> layernorm_offsets);
    void params_needed(std::size_t begin, std::size_t end) const {
        if (hooks_.params_needed) hooks_.params_needed(begin, end);
    }
    void params_prefetch(std::size_t begin, std::size_t end) const {
        if (hooks_.params_prefetch && begin < end) hooks_.params_prefetch(begin, end);
    }
    void params_done(std::size_t begin, std::size_t end) const {
        if (hooks_.params_done) hooks_.params_done(begin, end);
    }
    void grads_needed(std::size_t begin, std::size_t end) const {
        if (hooks_.grads_needed) hooks_.grads_needed(begin, end);
    }
    // The parameters read after layer i of local chunk c's forward (the next layer's, or the
    // head's ln_f) and before it in its backward (the previous layer's); empty if none.
    std::pair<std::size_t, std::size_t> next_in_forward(int c, int i) const;
    std::pair<std::size_t, std::size_t> next_in_backward(int c, int i) const;
    // ---- low-rank adapters (model/gpt_adapters.cpp) ----
    // An adapter's dropout on its input: the probability (0 outside training) and the seed
    // of its masks.
    struct AdapterDropout {
        float drop;
        uint64_t seed;
    };
    AdapterDropout adapter_dropout(const Activations& a, int l, AdapterTarget t) const;
    // Adapter t of layer l on the linear's input x (N, in) and output y (N, out) (this rank's
    // widths): down keeps h = s·drop(x)·A^T (N, r) for up and the backward, up adds h·B^T to y.
    void adapter_down(AdapterDropout d, int l, AdapterTarget t, kernels::ConstPtr x,
                      kernels::Ptr h);
    void adapter_up(int l, AdapterTarget t, kernels::ConstPtr h, kernels::Ptr y);
    // Its backward from the output's gradient dy (N, out): g = s·dy·B (N, r); the weights'
    // part adds dy^T·h into dB and g^T·drop(x) into dA, the inputs' part g·A, through the
    // dropout, into dx (N, in).
    void adapter_backward(AdapterDropout d, int l, AdapterTarget t, kernels::ConstPtr x,
                          kernels::ConstPtr dy, kernels::Ptr dx, kernels::ConstPtr h, Part part);
    // The input x (N, in) of adapter t with its dropout, each element's mask drawn at its
    // index in the whole (B, seq_len, in) input (so every split draws the same), into
    // adapter_x_; x itself without dropout.
    kernels::ConstPtr adapter_input(AdapterDropout d, AdapterTarget t, kernels::ConstPtr x);
    // Calls fn(local, whole, count) for each run of adapter t's input (N, in) that is
    // contiguous in the whole input (B, seq_len, in): element offsets into each.
    void for_each_input_run(
        AdapterTarget t,
        const std::function<void(std::size_t, std::size_t, std::size_t)>& fn) const;
    // Widths of adapter t's linear on this rank, (in, out), and where this rank's columns of
    // its input start in the whole.
    std::pair<int, int> adapter_widths(AdapterTarget t) const;
    int adapter_input_column(AdapterTarget t) const;
    // After layer l's last backward of a step: its replicated factors' gradients summed over
    // the tensor group, the layer's adapters announced final.
    void adapter_gradients_final(int l);

    // The ranges of the embedding's tensors, of the head's ln_f and of wte.
    std::pair<std::size_t, std::size_t> embedding_range() const;
    std::pair<std::size_t, std::size_t> lnf_range() const;
    std::pair<std::size_t, std::size_t> wte_range() const;
    uint64_t site_seed(const Activations& a, int layer, int site) const;
    // The positions of this rank's tokens (device, i32), or null when it holds them all.
    const int32_t* positions() const {
        return context_ ? static_cast<const int32_t*>(positions_.data().data) : nullptr;
    }
    // Dropout on this rank's rows (R,C) of the residual stream, in place, drawing each
    // element's mask at its index in the whole microbatch (B, T, C) (residual_runs_).
    void dropout_rows(kernels::Ptr x, float drop, uint64_t seed);
    // The gradient before a dropout site given the one after it (rows of this rank): dout
    // itself without dropout, else dout through the site's mask, written to dc_mine_.
    kernels::ConstPtr through_dropout(kernels::ConstPtr dout, std::size_t count, float drop,
                                      uint64_t seed);
    // All rows from this rank's rows: all-gather into `all` with sequence parallelism, else
    // they already are all rows.
    kernels::ConstPtr all_rows(kernels::ConstPtr mine, kernels::Ptr all);
    // This rank's rows of the sum over the tensor group of `partial` (N,C): reduce-scatter
    // into `mine` with sequence parallelism, else all-reduce in place (and `mine` is it).
    kernels::Ptr reduce_rows(kernels::Ptr partial, kernels::Ptr mine);

    kernels::Ops& ops_;
    parallel::SoloComm solo_;
    parallel::Comm& tensor_;
    bool sequence_parallel_;
    ParamLayout layout_;
    int B_, T_;      // T: this rank's tokens of a sequence, seq_len / C
    int rows_;       // N = B*T rows of a microbatch
    int rows_mine_;  // rows of the residual stream on this rank: N/M or N
    // This rank's residual rows as runs of consecutive rows of the whole microbatch (B,
    // seq_len): (first local row, its row in the whole, rows). One run without context
    // parallelism; dropout draws each run's mask from its place in the whole.
    struct RowRun {
        std::size_t local, whole, rows;
    };
    std::vector<RowRun> residual_runs_;
    std::vector<RowRun> all_runs_;  // the same for all N rows (an adapter's input)
    float dropout_;
    Recompute recompute_;
    Precision precision_;
    Sharding sharding_;
    StepHooks hooks_;
    bool split_backward_ = false;
    // Context parallelism (null without): the attention over the whole sequence, and the
    // positions of this rank's tokens (T, i32) for the embedding.
    std::unique_ptr<ContextAttention> context_;
    DeviceBuffer positions_;

    FlatBuffer params_, grads_;

    // Low-rank adapters (empty without): their parameters and gradients, and scratch: an
    // adapter's input after dropout or its input's gradient (N, max in), its output (N, max
    // out), the gradient of its h (N, r).
    Adapters adapters_;
    ParamLayout adapter_layout_;
    FlatBuffer adapter_params_, adapter_grads_;
    DeviceBuffer adapter_x_, adapter_y_, adapter_g_;

    // Activations of the (microbatch, chunk) pairs in flight, and a pool per chunk of sets
    // freed by their backward, for the next forward to reuse.
    std::map<std::pair<int, int>, std::unique_ptr<Activations>> live_;
    std::vector<std::vector<std::unique_ptr<Activations>>> pool_;
    std::size_t activation_bytes_ = 0;
    // What recompute rebuilds, one layer at a time: att alone (selective) or a whole layer
    // but its output (full); null without recompute.
    std::unique_ptr<LayerActivations> recompute_scratch_;

    // Forward scratch: a row-parallel layer's partial output (N,C), and its reduced rows
    // (R,C) with sequence parallelism (without, the reduction is in place).
    DeviceBuffer proj_partial_, proj_reduced_;

    DeviceBuffer loss_sum_;  // (1) f64: the microbatches' mean losses, until take_loss_sum

    // Gradient scratch for backward, reused layer by layer.
    DeviceBuffer dresidual_;    // (R,C) gradient of the residual stream
    DeviceBuffer dc_a_, dc_b_;  // (N,C)
    DeviceBuffer dc_mine_;      // (R,C)
    DeviceBuffer dc_all_;       // (N,C)
    DeviceBuffer df_a_, df_b_;  // (N,F/M)
    DeviceBuffer dqkv_;         // (N,3C/M)
};

}  // namespace trident::model
