// The model's shape, a pipeline stage's part of it and its low-rank adapters, as the config
// describes them.
#pragma once

#include "config/config.h"
#include "model/gpt.h"
#include "model/param_layout.h"

namespace trident::train {

inline model::GptShape gpt_shape(const config::Config& cfg) {
    model::GptShape s;
    s.vocab = cfg.model.vocab_size;
    s.padded_vocab = cfg.derived.padded_vocab;
    s.max_seq = cfg.model.seq_len;
    s.layers = cfg.model.layers;
    s.hidden = cfg.model.hidden;
    s.heads = cfg.model.heads;
    s.ffn = cfg.model.ffn_hidden;
    return s;
}

inline model::StagePlan stage_plan(const config::Config& cfg, int stage) {
    return model::StagePlan{cfg.parallel.pipeline, stage, cfg.parallel.virtual_stages,
                            cfg.derived.chunk_layers};
}

// training.lora: the adapters (rank 0: none), their scale alpha / r and their dropout.
inline model::Adapters adapters_of(const config::Config& cfg) {
    const config::LoraConfig& lora = cfg.training.lora;
    model::Adapters a;
    if (!lora.enabled()) return a;
    a.shape.rank = lora.rank;
    for (const config::LoraTarget t : lora.targets)
        a.shape.targets[static_cast<std::size_t>(t)] = true;
    a.scale = static_cast<float>(lora.alpha / lora.rank);
    a.dropout = static_cast<float>(lora.dropout);
    return a;
}

}  // namespace trident::train
