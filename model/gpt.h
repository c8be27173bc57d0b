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
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "model/param_layout.h"
#include "parallel/comm.h"
#include "parallel/solo_comm.h"

namespace trident::model {

// A device buffer of floats that releases itself.
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    DeviceBuffer(kernels::Ops& ops, std::size_t count);
    ~DeviceBuffer();
    DeviceBuffer(DeviceBuffer&& other) noexcept;
    DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    float* data() const { return data_; }
    std::size_t size() const { return count_; }

private:
    kernels::Ops* ops_ = nullptr;
    float* data_ = nullptr;
    std::size_t count_ = 0;
};

class Gpt {
public:
    // micro_batch x seq_len is the shape of every microbatch this model will run. `tensor` is
    // the tensor-parallel group (null: not split).
    Gpt(kernels::Ops& ops, const GptShape& shape, int micro_batch, float dropout,
        parallel::Comm* tensor = nullptr, bool sequence_parallel = false);

    const ParamLayout& layout() const { return layout_; }  // this rank's slice
    const GptShape& shape() const { return layout_.shape(); }
    int micro_batch() const { return B_; }
    bool sequence_parallel() const { return sequence_parallel_; }
    float* params() { return params_.data(); }
    float* grads() { return grads_.data(); }
    const float* params() const { return params_.data(); }

    // GPT-2 initialisation of the whole model, a pure function of (seed, tensor, element) so
    // every split gets the same model: normal(0, init_std) for matrices and embeddings,
    // init_std/sqrt(2*layers) for the residual output projections, zero biases, unit
    // LayerNorm gains; padded vocabulary rows zero.
    void init_random(uint64_t seed, float init_std);
    // This rank's slice, as laid out by layout().
    void load_params(const std::vector<float>& local);
    std::vector<float> params_to_host() const;
    std::vector<float> grads_to_host() const;
    // The whole model (a tensor-size-1 layout's buffer): take this rank's slice of it, or
    // gather every rank's slice into it (collective over the tensor group).
    void load_full_params(const std::vector<float>& full);
    std::vector<float> full_params_to_host();
    std::vector<float> full_grads_to_host();

    // Runs the model on one microbatch: inputs and targets (B, T) token ids on the host.
    // Returns the mean loss over its B*T tokens. `training` enables dropout, drawn from
    // dropout_seed (one seed per microbatch; each site derives its own from it).
    float forward(const int32_t* inputs, const int32_t* targets, bool training,
                  uint64_t dropout_seed);
    // The next-token logits (V) at `position` of the first sequence of `inputs` (B, T), for
    // generation: no loss, no dropout. Needs the whole vocabulary on this rank (M = 1).
    std::vector<float> logits_at(const int32_t* inputs, int position);
    // Backward of the last forward; every token's loss is weighted by dloss, so the
    // gradients of a global batch of K tokens accumulate with dloss = 1/K.
    void backward(float dloss);
    // Completes the gradients of a step after its last backward: with sequence parallelism
    // the LayerNorm gradients are partial sums over each rank's rows and are summed here.
    void finish_gradients();
    void zero_grads();

private:
    struct LayerActivations {
        DeviceBuffer ln1, ln1_mean, ln1_rstd;  // (R,C), (R), (R): R = this rank's rows
        DeviceBuffer ln1_all;                  // (N,C) all rows of ln1 (sequence parallel)
        DeviceBuffer qkv;                      // (N,3C/M)
        DeviceBuffer att;                      // (B,NH/M,T,T)
        DeviceBuffer atty;                     // (N,C/M)
        DeviceBuffer resid2;                   // (R,C)
        DeviceBuffer ln2, ln2_mean, ln2_rstd;  // (R,C), (R), (R)
        DeviceBuffer ln2_all;                  // (N,C) (sequence parallel)
        DeviceBuffer fch, fch_gelu;            // (N,F/M), (N,F/M)
        DeviceBuffer resid3;                   // (R,C), the next layer's input
    };

    // Embedding, blocks, final LayerNorm and LM head into logits_.
    void forward_logits(const int32_t* inputs, bool training, uint64_t dropout_seed);
    uint64_t site_seed(int layer, int site) const;
    // The gradient before a dropout site given the one after it (rows of this rank): dout
    // itself without dropout, else dout through the site's mask, written to dc_b_.
    const float* through_dropout(const float* dout, std::size_t count, float drop, uint64_t seed);
    // All rows from this rank's rows: all-gather into `all` with sequence parallelism, else
    // they already are all rows.
    const float* all_rows(const float* mine, float* all);
    // This rank's rows of the sum over the tensor group of `partial` (N,C): reduce-scatter
    // into `mine` with sequence parallelism, else all-reduce in place (and `mine` is it).
    float* reduce_rows(float* partial, float* mine);
    kernels::Ops& ops_;
    parallel::SoloComm solo_;
    parallel::Comm& tensor_;
    bool sequence_parallel_;
    ParamLayout layout_;
    int B_, T_;
    int rows_;                 // N = B*T rows of a microbatch
    int rows_mine_;            // rows of the residual stream on this rank: N/M or N
    uint64_t first_element_;   // global index of this rank's first residual element (dropout)
    float dropout_;

    DeviceBuffer params_, grads_;

    // Activations of the last forward.
    DeviceBuffer inputs_, targets_;  // (B,T) token ids, stored as int32 in float-sized slots
    DeviceBuffer embedded_;          // (N,C) partial sums of the vocab-parallel lookup
    DeviceBuffer encoded_;           // (R,C)
    std::vector<LayerActivations> acts_;
    DeviceBuffer lnf_, lnf_mean_, lnf_rstd_;  // (R,C), (R), (R)
    DeviceBuffer lnf_all_;                    // (N,C) (sequence parallel)
    DeviceBuffer logits_;                     // (N,Vp/M), turned into dlogits by backward
    DeviceBuffer loss_stats_;  // (4,N): row max | global max | sum of exps | target logit
    DeviceBuffer lse_, losses_;               // (N), (N)
    // Forward scratch: a row-parallel layer's partial output (N,C), and its reduced rows
    // (R,C) with sequence parallelism (without, the reduction is in place).
    DeviceBuffer proj_partial_, proj_reduced_;
    bool training_ = false;
    uint64_t dropout_seed_ = 0;

    // Gradient scratch for backward, reused layer by layer.
    DeviceBuffer dresidual_;       // (R,C) gradient of the residual stream
    DeviceBuffer dc_a_, dc_b_;     // (N,C)
    DeviceBuffer dc_mine_;         // (R,C)
    DeviceBuffer dc_all_;          // (N,C)
    DeviceBuffer df_a_, df_b_;     // (N,F/M)
    DeviceBuffer dqkv_;            // (N,3C/M)
    DeviceBuffer datt_;            // (B,NH/M,T,T)
};

}  // namespace trident::model
