// One of the model's flat buffers of weights and its gradients as a layout lays them out on this
// rank: the model's own, or its low-rank adapters' (model/param_layout.h). Here is their host
// side: loading them, reading them back, and this rank's share of the whole model's (each
// element written by exactly one rank of the stage and tensor groups, so that summing the
// shares of all ranks gives the whole). The buffers themselves are the model's (model/gpt.h).
#pragma once

#include <cstdint>
#include <vector>

#include "model/flat_buffer.h"
#include "model/param_layout.h"

namespace trident::model {

class WeightSet {
public:
    // `layout`: this rank's; `whole`: the same tensors for M 1 and one stage.
    WeightSet(const ParamLayout& layout, ParamLayout whole, FlatBuffer& params, FlatBuffer& grads);

    const ParamLayout& layout() const { return *layout_; }
    const ParamLayout& whole() const { return whole_; }
    FlatBuffer& params() const { return *params_; }
    FlatBuffer& grads() const { return *grads_; }

    // This rank's part, as layout() lays it out (without the buffer's padding). Sharded, what
    // this replica holds: loaded from its parts of `local`, and returned in their places with
    // zeros elsewhere (the gradients: the shard the reduction filled).
    void load(const std::vector<float>& local);
    std::vector<float> params_to_host() const;
    std::vector<float> grads_to_host() const;
    // The whole (a buffer of whole()): load this rank's part of it.
    void load_whole(const std::vector<float>& whole);
    // This rank's share of the whole: its parts of `local` in their places, zero elsewhere.
    std::vector<float> share_of_whole(const std::vector<float>& local) const;

private:
    const ParamLayout* layout_;
    ParamLayout whole_;
    FlatBuffer* params_;
    FlatBuffer* grads_;
};

// The model's own weights as its parts declared they start (ParamTensor::init), a pure function
// of (seed, tensor, element) so every split gets the same model: normal(0, init_std) for
// matrices and embeddings, init_std/sqrt(2*layers) for GPT-2's residual output projections,
// zero biases, unit norm gains; padded vocabulary rows zero.
void init_random(WeightSet& weights, uint64_t seed, float init_std);
// The same for the whole model on the host: a buffer of `whole` (M 1, one stage).
std::vector<float> random_whole(const ParamLayout& whole, uint64_t seed, float init_std);

}  // namespace trident::model
