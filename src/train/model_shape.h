// The model's shape, and a pipeline stage's part of it, as the config describes them.
#pragma once

#include "config/config.h"
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

}  // namespace trident::train
