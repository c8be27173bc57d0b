// Rank sizes, stage chunks and the in-flight walk of a schedule (see stage_shape.h).
#include "plan/stage_shape.h"

#include <algorithm>
#include <set>
#include <tuple>

#include "pipeline/executor.h"

namespace trident::plan {

RankDims rank_dims(const config::Config& cfg) {
    const auto& m = cfg.model;
    const int64_t M = cfg.parallel.tensor;
    RankDims d;
    d.B = cfg.training.micro_batch;
    d.context = cfg.parallel.context;
    d.ring = d.context > 1 && cfg.parallel.context_mode == config::ContextMode::ring;
    d.T = m.seq_len / d.context;
    d.N = d.B * d.T;
    // The model ignores sequence parallelism on one tensor rank (model/gpt.cpp).
    d.sequence_parallel = cfg.parallel.sequence_parallel && M > 1;
    d.R = d.sequence_parallel ? d.N / M : d.N;
    d.C = m.hidden;
    d.Cm = m.hidden / M;
    d.Fm = m.ffn_hidden / M;
    d.heads = m.heads / M;
    d.vocab = cfg.derived.padded_vocab / M;
    return d;
}

std::vector<ChunkShape> stage_chunks(const config::Config& cfg, int stage) {
    const int P = cfg.parallel.pipeline, v = cfg.parallel.virtual_stages;
    std::vector<ChunkShape> chunks;
    for (int c = 0; c < v; ++c) {
        const int g = pipeline::global_chunk(P, stage, c);
        chunks.push_back(
            {cfg.derived.chunk_layers[static_cast<std::size_t>(g)], g == 0, g == P * v - 1});
    }
    return chunks;
}

GemmFlops gemm_flops(const config::Config& cfg) {
    using config::Recompute;
    const RankDims d = rank_dims(cfg);
    const double N = d.N, C = d.C, Cm = d.Cm, Fm = d.Fm, T = d.T, B = d.B;
    const double V = static_cast<double>(d.vocab);
    // qkv, projection, fc1, fc2, and the two attention products (causal: half of 4·B·T²·C/M).
    const double fc2 = 2 * N * Fm * C;
    const double scores = B * T * T * d.context * Cm;  // Q·Kᵀ, causal half (whole-sequence keys)
    GemmFlops f;
    f.layer_forward = 2 * N * C * 3 * Cm + 2 * N * Cm * C + 2 * N * C * Fm + fc2 + 2 * scores;
    double rerun = 0;
    if (cfg.training.recompute == Recompute::full) rerun = f.layer_forward - fc2;
    if (cfg.training.recompute == Recompute::selective) rerun = scores;
    f.layer_backward = 2 * f.layer_forward + rerun;
    f.layer_weight = f.layer_forward - 2 * scores;  // one GEMM per linear, none for attention
    f.head_forward = 2 * N * C * V;
    f.head_backward = 4 * N * C * V;
    f.head_weight = 2 * N * C * V;
    return f;
}

pipeline::Kind schedule_kind(const config::Config& cfg) {
    return cfg.parallel.schedule;
}

InFlight in_flight(const config::Config& cfg, int stage) {
    using pipeline::Op;
    const int P = cfg.parallel.pipeline, v = cfg.parallel.virtual_stages;
    const int m = cfg.derived.grad_accum_steps;
    const std::vector<ChunkShape> chunks = stage_chunks(cfg, stage);
    InFlight f;
    f.sets.assign(static_cast<std::size_t>(v), 0);
    std::vector<int> live(static_cast<std::size_t>(v), 0);
    // The executor's buffers (pipeline/executor.h): a received one, by (what, microbatch,
    // chunk), from its receive until its compute; the outgoing ones a pool of a fixed size,
    // allocated once a stage sends anything.
    enum { act_in, grad_in };
    std::set<std::tuple<int, int, int>> messages;
    int most_received = 0;
    bool sends = false;
    const auto hold = [&](int what, int mb, int c) {
        messages.insert({what, mb, c});
        most_received = std::max(most_received, static_cast<int>(messages.size()));
    };
    for (const pipeline::Instr& in : pipeline::schedule(schedule_kind(cfg), P, v, m, stage)) {
        const std::size_t c = static_cast<std::size_t>(in.chunk);
        switch (in.op) {
            case Op::recv_act:
                hold(act_in, in.microbatch, in.chunk);
                break;
            case Op::recv_grad:
                hold(grad_in, in.microbatch, in.chunk);
                break;
            case Op::forward:
                f.sets[c] = std::max(f.sets[c], ++live[c]);
                messages.erase({act_in, in.microbatch, in.chunk});
                break;
            case Op::backward:
            case Op::backward_weight:  // a split backward frees the activations at its W
                --live[c];
                messages.erase({grad_in, in.microbatch, in.chunk});
                break;
            case Op::backward_input:
                messages.erase({grad_in, in.microbatch, in.chunk});
                break;
            case Op::send_act:
            case Op::send_grad:
                sends = true;
                break;
        }
    }
    f.messages = most_received + (sends ? pipeline::Executor::kSendBuffers : 0);
    return f;
}

}  // namespace trident::plan
