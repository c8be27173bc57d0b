// The GPT-2 model: parameters, activations, and the hand-written forward and backward passes
// for one microbatch, composed from the ops of kernels/ops.h.
//
// Parameters and gradients each live in one flat buffer laid out by ParamLayout. Backward
// ADDS into the gradient buffer, so gradient accumulation over microbatches is just calling
// forward/backward repeatedly with dloss = 1 / (tokens in the global batch).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "model/param_layout.h"

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
    // micro_batch x seq_len is the shape of every microbatch this model will run.
    Gpt(kernels::Ops& ops, const GptShape& shape, int micro_batch, float dropout);

    const ParamLayout& layout() const { return layout_; }
    const GptShape& shape() const { return layout_.shape(); }
    int micro_batch() const { return B_; }
    float* params() { return params_.data(); }
    float* grads() { return grads_.data(); }
    const float* params() const { return params_.data(); }

    // GPT-2 initialisation, a pure function of (seed, tensor, element): normal(0, init_std)
    // for matrices and embeddings, init_std/sqrt(2*layers) for the residual output
    // projections, zero biases, unit LayerNorm gains; padded vocabulary rows zero.
    void init_random(uint64_t seed, float init_std);
    void load_params(const std::vector<float>& host);  // layout().total() floats
    std::vector<float> params_to_host() const;
    std::vector<float> grads_to_host() const;

    // Runs the model on one microbatch: inputs and targets (B, T) token ids on the host.
    // Returns the mean loss over its B*T tokens. `training` enables dropout, drawn from
    // dropout_seed (one seed per microbatch; each site derives its own from it).
    float forward(const int32_t* inputs, const int32_t* targets, bool training,
                  uint64_t dropout_seed);
    // The next-token logits (V) at `position` of the first sequence of `inputs` (B, T), for
    // generation: no loss, no dropout.
    std::vector<float> logits_at(const int32_t* inputs, int position);
    // Backward of the last forward; every token's loss is weighted by dloss, so the
    // gradients of a global batch of K tokens accumulate with dloss = 1/K.
    void backward(float dloss);
    void zero_grads();

private:
    struct LayerActivations {
        DeviceBuffer ln1, ln1_mean, ln1_rstd;  // (B,T,C), (B,T), (B,T)
        DeviceBuffer qkv;                      // (B,T,3C)
        DeviceBuffer att;                      // (B,NH,T,T)
        DeviceBuffer atty;                     // (B,T,C)
        DeviceBuffer attproj;                  // (B,T,C), after dropout
        DeviceBuffer resid2;                   // (B,T,C)
        DeviceBuffer ln2, ln2_mean, ln2_rstd;  // (B,T,C), (B,T), (B,T)
        DeviceBuffer fch, fch_gelu;            // (B,T,F), (B,T,F)
        DeviceBuffer fcproj;                   // (B,T,C), after dropout
        DeviceBuffer resid3;                   // (B,T,C), the next layer's input
    };

    // Embedding, blocks, final LayerNorm and LM head into logits_.
    void forward_logits(const int32_t* inputs, bool training, uint64_t dropout_seed);
    uint64_t site_seed(int layer, int site) const;
    // The gradient before a dropout site given the one after it: dout itself without
    // dropout, else dout through the site's mask, written to dc_b_.
    const float* through_dropout(const float* dout, std::size_t count, float drop, uint64_t seed);

    kernels::Ops& ops_;
    ParamLayout layout_;
    int B_, T_;
    float dropout_;

    DeviceBuffer params_, grads_;

    // Activations of the last forward.
    DeviceBuffer inputs_, targets_;  // (B,T) token ids, stored as int32 in float-sized slots
    DeviceBuffer encoded_;           // (B,T,C)
    std::vector<LayerActivations> acts_;
    DeviceBuffer lnf_, lnf_mean_, lnf_rstd_;  // (B,T,C), (B,T), (B,T)
    DeviceBuffer logits_;                     // (B,T,Vp), turned into dlogits by backward
    DeviceBuffer lse_, losses_;               // (B,T), (B,T)
    bool training_ = false;
    uint64_t dropout_seed_ = 0;

    // Gradient scratch for backward, reused layer by layer.
    DeviceBuffer dresidual_;       // (B,T,C) gradient of the residual stream
    DeviceBuffer dc_a_, dc_b_;     // (B,T,C)
    DeviceBuffer df_a_, df_b_;     // (B,T,F)
    DeviceBuffer dqkv_;            // (B,T,3C)
    DeviceBuffer datt_;            // (B,NH,T,T)
};

}  // namespace trident::model
