// The model's shape, a pipeline stage's part of it and its low-rank adapters, as the config
// describes them.
#pragma once

#include "config/config.h"
#include "model/dims.h"
#include "model/gpt.h"
#include "model/hf_llama_config.h"
#include "model/param_layout.h"

namespace trident::config {

inline model::GptShape gpt_shape(const Config& cfg) {
    model::GptShape s;
    s.vocab = cfg.model.vocab_size;
    s.padded_vocab = cfg.derived.padded_vocab;
    s.max_seq = cfg.model.seq_len;
    s.layers = cfg.model.layers;
    s.hidden = cfg.model.hidden;
    s.heads = cfg.model.heads;
    s.ffn = cfg.model.ffn_hidden;
    s.kv_heads = cfg.model.kv_heads;
    s.head_dim = cfg.model.head_dim;
    s.arch = cfg.model.arch;
    s.tied = cfg.model.tie_embeddings;
    s.norm_eps = static_cast<float>(cfg.model.norm_eps);
    s.rope_theta = static_cast<float>(cfg.model.rope_theta);
    s.qk_norm = cfg.model.qk_norm;
    s.mlp = cfg.model.mlp;
    s.moe = cfg.model.moe;
    if (s.moe.enabled() && s.moe.ffn_hidden == 0) s.moe.ffn_hidden = s.ffn;
    return s;
}

// The llama model as Hugging Face's config.json states it; max_position_embeddings is the
// sequence length trained on.
inline model::HfLlamaConfig hf_llama_config(const Config& cfg) {
    const ModelConfig& m = cfg.model;
    model::HfLlamaConfig c;
    c.vocab = m.vocab_size;
    c.hidden = m.hidden;
    c.layers = m.layers;
    c.heads = m.heads;
    c.kv_heads = m.kv_heads;
    c.head_dim = m.head_dim;
    c.ffn = m.ffn_hidden;
    c.max_positions = m.seq_len;
    c.rope_theta = m.rope_theta;
    c.norm_eps = m.norm_eps;
    c.tied = m.tie_embeddings;
    c.qk_norm = m.qk_norm;
    c.moe = m.moe;
    if (c.moe.enabled() && c.moe.ffn_hidden == 0) c.moe.ffn_hidden = m.ffn_hidden;
    return c;
}

// One rank's sizes of a microbatch (tensor rank 0: every rank's are the same).
inline model::Dims rank_dims(const Config& cfg) {
    return model::make_dims(
        gpt_shape(cfg),
        model::DimsInputs{cfg.training.micro_batch, cfg.parallel.tensor, 0, cfg.parallel.context,
                          cfg.parallel.sequence_parallel, cfg.parallel.tp_overlap,
                          cfg.parallel.context_mode, cfg.training.precision, cfg.parallel.expert});
}

// The ranks the experts' weights are split over (model/param_layout.h): parallel.expert at
// every ZeRO stage, with hybrid sharding too (E divides data_shard: each shard group holds every
// expert, an (N/E)-th of each on each of its expert-shard ranks).
inline int expert_shards(const ParallelConfig& p) {
    return p.expert;
}

// What pipeline stage `stage` holds, as expert rank `expert_rank` (its place in the expert
// group).
inline model::StagePlan stage_plan(const Config& cfg, int stage, int expert_rank = 0) {
    return model::StagePlan{cfg.parallel.pipeline,
                            stage,
                            cfg.parallel.virtual_stages,
                            cfg.derived.chunk_layers,
                            pipeline::placement(cfg.parallel.schedule),
                            expert_shards(cfg.parallel),
                            expert_rank};
}

// training.lora: the adapters (rank 0: none), their scale alpha / r and their dropout.
inline model::Lora lora_of(const Config& cfg) {
    const LoraConfig& lora = cfg.training.lora;
    model::Lora a;
    if (!lora.enabled()) return a;
    a.shape.rank = lora.rank;
    for (const model::LoraTarget t : lora.targets)
        a.shape.targets[static_cast<std::size_t>(t)] = true;
    a.scale = static_cast<float>(lora.alpha / lora.rank);
    a.dropout = static_cast<float>(lora.dropout);
    if (lora.quantized()) a.quant_block = static_cast<std::size_t>(lora.quant_block);
    a.double_quant = lora.double_quant;
    return a;
}

// The model of pipeline stage `stage` (as expert rank `expert_rank`) as the config describes
// it, its buffers held as the data-parallel module plans (data_parallel::buffer_plan).
inline model::GptOptions gpt_options(const Config& cfg, int stage, const model::BufferPlan& buffers,
                                     int expert_rank = 0) {
    const TrainingConfig& t = cfg.training;
    const ParallelConfig& p = cfg.parallel;
    model::GptOptions o;
    o.shape = gpt_shape(cfg);
    o.plan = stage_plan(cfg, stage, expert_rank);
    o.micro_batch = t.micro_batch;
    o.dropout = static_cast<float>(cfg.model.dropout);
    o.sequence_parallel = p.sequence_parallel;
    o.tp_overlap = p.tp_overlap;
    o.ep_overlap = p.ep_overlap;
    o.context_mode = p.context_mode;
    o.recompute = t.recompute;
    o.split_backward = pipeline::splits_backward(p.schedule);
    // 16-bit parameters, activations and (unless fp32_grad_accumulation) gradients.
    o.precision = model::Precision{
        t.precision, t.fp32_grad_accumulation ? kernels::DType::f32 : t.precision, t.precision};
    o.buffers = buffers;
    o.lora = lora_of(cfg);
    o.documents = model::DocumentOptions{cfg.data.documents == DocumentMode::mask,
                                         cfg.data.eod_token, cfg.data.mask_eod_loss};
    return o;
}

}  // namespace trident::config
