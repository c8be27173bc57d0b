// Incremental decoding for generation: the whole model in one process (micro batch 1, no
// dropout) over a key/value cache (model/kv_cache.h). A prompt runs once through every layer
// (prefill, all its tokens in one pass); each new token then runs one position through every
// layer, attending to the cache, so a token costs one row's work instead of the context's.
//
// The parts are the training's (model/stage_parts.h: norms, linears, MLP, embedding, head)
// built over the same weights for a pass of the prompt's width (prefill) and of one row
// (step); only their attention core is generation's (CachedAttention). A pass's tokens sit at
// positions length() .. of the sequence, in the scratch the embedding (wpe) and rotary read
// (StageParts::positions) when the pass is narrower than seq_len.
//
// Shapes: the cache (per layer (seq_len, KVH·d) for k and v); logits (V) of the pass's last
// token, the padded columns dropped.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/ops.h"
#include "model/gpt.h"  // ModelGroups
#include "model/kv_cache.h"

namespace trident::model {

class Decoder {
public:
    // `params`: the whole model as ParamLayout(shape) lays it out; `groups` of one process.
    Decoder(kernels::Ops& ops, const GptShape& shape, const ModelGroups& groups,
            const std::vector<float>& params);
    ~Decoder();

    const GptShape& shape() const { return layout_.shape(); }
    const KvCache& cache() const { return cache_; }
    // Positions in the cache: the next token's.
    int length() const { return cache_.length(); }
    // Empties the cache and runs `tokens` (1 .. seq_len of them) at positions 0 ..; the
    // logits after the last.
    std::vector<float> prefill(const std::vector<int32_t>& tokens);
    // Runs `token` at position length() (< seq_len); the logits after it.
    std::vector<float> step(int32_t token);

private:
    struct Parts;  // the parts built for one pass width

    // The pass's T `tokens` from position length(); the logits after the last of them.
    std::vector<float> run(Parts& p, const int32_t* tokens);

    kernels::Ops& ops_;
    ModelGroups groups_;
    ParamLayout layout_;
    Weights weights_;
    KvCache cache_;
    std::unique_ptr<Parts> prompt_;  // the last prompt's width
    std::unique_ptr<Parts> one_;
};

}  // namespace trident::model
