// Text generation: continues a sequence of token ids with the model, one token at a time, over
// a key/value cache (model/decoder.h): the prompt runs once, then each new token one position.
//
// The context window: the model sees at most seq_len positions. A prompt longer than that
// keeps its last seq_len tokens; when the cache is full, the window slides by half: the last
// kept_on_slide(seq_len) tokens are run again from position 0 (a prefill) and decoding goes on
// from there.
//
// Packed documents (SamplingOptions::eod): a token sees only its own document, at positions
// from 0, as training's document mask does; so the context is the tokens after the last eod
// before the newest token. A prompt's earlier documents are never run; the token after an eod
// starts a new document: the cache is emptied and it runs alone at position 0; a slide keeps
// the last kept_on_slide(seq_len) tokens of the current document.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "config/config.h"
#include "kernels/ops.h"
#include "model/decoder.h"
#include "parallel/grid.h"

namespace trident::train {

// The whole model in this process over a key/value cache: what generation runs. `params`: the
// whole model as model::ParamLayout(shape) lays it out.
class GenerationModel {
public:
    GenerationModel(kernels::Ops& ops, const model::GptShape& shape,
                    const std::vector<float>& params);
    model::Decoder& decoder() { return decoder_; }

private:
    parallel::Grid solo_;
    model::Decoder decoder_;
};

// The defaults (temperature 0.8 among the 40 likeliest) give a small model's samples far better
// text than temperature 1 over every token, whose rare tokens add up to much of the mass.
struct SamplingOptions {
    int tokens = 64;           // how many to generate
    double temperature = 0.8;  // 0 = greedy (the most likely token, lowest id on ties)
    int top_k = 40;            // sample among the k most likely; 0 = all
    uint64_t seed = 0;
    // Packed documents (data.documents: mask): a document ends after each `eod` token, and a
    // token sees only its own document, at positions from 0 (docs/FEATURES.md); -1: the
    // context is one sequence.
    int32_t eod = -1;
};
// The documents setting of a model trained with `cfg`'s data: its eod under mask, else -1.
int32_t generation_eod(const config::DataConfig& data);

// Tokens run again when a full cache slides its window: half of seq_len, at least 1.
std::size_t kept_on_slide(int seq_len);

// Returns the generated ids (not the prompt), each also handed to `each` (if given) as soon as
// it is chosen, so a caller can show it before the next is computed. `prompt` must not be
// empty.
std::vector<int32_t> generate(model::Decoder& model, const std::vector<int32_t>& prompt,
                              const SamplingOptions& opts,
                              const std::function<void(int32_t)>& each = {});

// The choice of one next token from its logits (V) under opts; `draw` numbers the choice so
// each is an independent pure function of (seed, draw).
int32_t sample_token(std::vector<float> logits, const SamplingOptions& opts, uint64_t draw);

}  // namespace trident::train
