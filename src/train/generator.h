// Text generation: continues a sequence of token ids with the model, one token at a time.
//
// No KV cache: every new token reruns the model over the context (at most seq_len tokens,
// the last ones kept), which is simple and cheap enough for samples and tests on the CPU.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/ops.h"
#include "model/gpt.h"
#include "parallel/grid.h"

namespace trident::train {

// The whole model in this process, with micro batch 1 and no dropout: what generation runs.
class GenerationModel {
public:
    GenerationModel(kernels::Ops& ops, const model::GptShape& shape);
    model::Gpt& gpt() { return gpt_; }

private:
    parallel::Grid solo_;
    model::Gpt gpt_;
};

// The defaults (temperature 0.8 among the 40 likeliest) give a small model's samples far better
// text than temperature 1 over every token, whose rare tokens add up to much of the mass.
struct SamplingOptions {
    int tokens = 64;           // how many to generate
    double temperature = 0.8;  // 0 = greedy (the most likely token, lowest id on ties)
    int top_k = 40;            // sample among the k most likely; 0 = all
    uint64_t seed = 0;
};

// Returns the generated ids (not the prompt), each also handed to `each` (if given) as soon as
// it is chosen, so a caller can show it before the next is computed. `model` runs with micro
// batch 1 or more (only the first sequence is used); `prompt` must not be empty.
std::vector<int32_t> generate(model::Gpt& model, const std::vector<int32_t>& prompt,
                              const SamplingOptions& opts,
                              const std::function<void(int32_t)>& each = {});

// The choice of one next token from its logits (V) under opts; `draw` numbers the choice so
// each is an independent pure function of (seed, draw).
int32_t sample_token(std::vector<float> logits, const SamplingOptions& opts, uint64_t draw);

}  // namespace trident::train
