// A mixture of experts' routing of one microbatch's tokens, on the host: from the router's fp32
// logits (rows, N) the k experts of each token and their weights, the rows permuted by expert
// (each expert's tokens contiguous, in token order), and the router's backward, the balancing
// loss's and the z-loss's gradients included (docs/ARCHITECTURE.md, "Mixture of experts").
// The semantics (docs/ARCHITECTURE.md), held against tests/python/moe_reference.py:
// - softmax: p = softmax(z), the k largest p, w = p / Σ_k p (normalize_top_k) or p;
// - sigmoid: s = sigmoid(z), the k largest s + bias, w = s / Σ_k s or s; p = s / Σ s;
// - w times `scale`; ties in the top-k go to the lower expert index;
// - capacity_factor c > 0: each expert keeps at most ceil(c·rows·k/N) of the choices of the
//   `rows` tokens routed together, those of the highest weight (ties: the earlier token); a
//   dropped choice's weight is 0 (Megatron-Core's "probs" drop policy) and it leaves the
//   permutation: no expert computes it, no exchange moves it.
#pragma once

#include <cstdint>
#include <vector>

#include "model/moe_settings.h"

namespace trident::model {

struct MoeRouting {
    int rows = 0, k = 0, experts = 0;
    std::vector<int32_t> expert;  // (rows, k): each token's experts, highest score first
    std::vector<float> weight;    // (rows, k): their weights, `scale` included
    std::vector<float> probs;     // (rows, N): p of the balancing loss
    std::vector<float> lse;       // (rows): logsumexp of each token's logits (the z-loss's)
    std::vector<int32_t> offset;  // (N + 1): expert e's rows of the permutation: offset[e] ..
    std::vector<int32_t> token;   // (permuted()): the token of each permuted row
    // (rows, k): the permuted row of each token's choice; -1 for a dropped one
    std::vector<int32_t> row_of;
    std::vector<int32_t> chosen;  // (N): the choices each expert received, dropped ones too
    // (rows, k): 1 where a capacity dropped the choice (its weight 0, its gradient none, no row
    // of the permutation); empty without a capacity.
    std::vector<uint8_t> dropped;
    int dropped_count = 0;

    int count(int e) const { return offset[e + 1] - offset[e]; }  // expert e's permuted rows
    int permuted() const { return offset.back(); }                // rows·k less those dropped
};

// The most choices an expert keeps of `rows` tokens routed together: ceil(c·rows·k/N).
int expert_capacity(const MoeSettings& moe, int rows);

// The routing of `rows` tokens from their logits (rows, N) and the per-expert bias (N, or null:
// zeros).
MoeRouting route(const MoeSettings& moe, const float* logits, const float* bias, int rows);

// What the router's backward adds to the loss trained besides the weights' gradient, per token
// of this rank: each loss's coefficient times the loss's d/d(token), dloss the weight of one
// token of the microbatch (1 / tokens of the global batch: model/gpt.h).
struct MoeLossGrads {
    const float* load = nullptr;  // (N): f_e, the microbatch's fraction of choices per expert
    float dloss = 0;
};

// dlogits (rows, N) = the gradient of the logits from d_weight (rows, k), the gradient of the
// loss with respect to each choice's weight, and the balancing and z losses.
void route_backward(const MoeSettings& moe, const MoeRouting& r, const float* logits,
                    const float* d_weight, const MoeLossGrads& losses, float* dlogits);

}  // namespace trident::model
