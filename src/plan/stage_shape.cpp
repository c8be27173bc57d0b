// Stage chunks and the in-flight walk of a schedule (see stage_shape.h).
#include "plan/stage_shape.h"

#include <algorithm>
#include <tuple>

#include "pipeline/executor.h"

namespace trident::plan {

std::vector<ChunkShape> stage_chunks(pipeline::Kind kind, int P, int v,
                                     const std::vector<int>& chunk_layers, int stage) {
    std::vector<ChunkShape> chunks;
    stage_chunks(kind, P, v, chunk_layers, stage, chunks);
    return chunks;
}

void stage_chunks(pipeline::Kind kind, int P, int v, const std::vector<int>& chunk_layers,
                  int stage, std::vector<ChunkShape>& chunks) {
    const model::ChunkMap map = pipeline::chunk_map(kind, P, v);
    chunks.clear();
    for (int c = 0; c < v; ++c) {
        const int g = map.global(stage, c);
        chunks.push_back({chunk_layers[static_cast<std::size_t>(g)], g == 0, g == P * v - 1});
    }
}

std::vector<ChunkShape> stage_chunks(const config::Config& cfg, int stage) {
    const auto& p = cfg.parallel;
    return stage_chunks(p.schedule, p.pipeline, p.virtual_stages, cfg.derived.chunk_layers, stage);
}

namespace {

// What one stage's stream keeps at once, walked as the executor walks it.
InFlight walk(const std::vector<pipeline::Instr>& stream, int v) {
    using pipeline::Op;
    InFlight f;
    f.sets.assign(static_cast<std::size_t>(v), 0);
    std::vector<int> live(static_cast<std::size_t>(v), 0);
    // The executor's buffers (pipeline/executor.h): a received one, by (what, microbatch,
    // chunk), from its receive until its compute; the outgoing ones a pool of a fixed size,
    // allocated once a stage sends anything.
    enum { act_in, grad_in };
    std::vector<std::tuple<int, int, int>> messages;  // few at once: a list
    int most_received = 0;
    bool sends = false;
    const auto hold = [&](int what, int mb, int c) {
        if (std::find(messages.begin(), messages.end(), std::tuple{what, mb, c}) == messages.end())
            messages.emplace_back(what, mb, c);
        most_received = std::max(most_received, static_cast<int>(messages.size()));
    };
    const auto release = [&](int what, int mb, int c) {
        const auto it = std::find(messages.begin(), messages.end(), std::tuple{what, mb, c});
        if (it != messages.end()) messages.erase(it);
    };
    for (const pipeline::Instr& in : stream) {
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
                release(act_in, in.microbatch, in.chunk);
                break;
            case Op::backward:
            case Op::backward_weight:  // a split backward frees the activations at its W
                --live[c];
                release(grad_in, in.microbatch, in.chunk);
                break;
            case Op::backward_input:
                release(grad_in, in.microbatch, in.chunk);
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

}  // namespace

namespace {

// The microbatches whose step holds what m's does at most. 1F1B and interleaved run a stage's
// warm-up forwards (at most 2(P − 1) + (v − 1)·P chunks), then one forward and one backward a
// step, then the cool-down's backwards, which only free. The steady part repeats every P·v
// steps (each chunk gets P forwards and P backwards), so its most is reached in its first
// period; with 3P microbatches (3P·v chunks: at least the warm-up and a period) and any more,
// warm-up and first period are the same streams. GPipe holds all m; the zero-bubble orders are
// walked whole.
int microbatches_walked(pipeline::Kind kind, int P, int m) {
    const bool periodic =
        kind == pipeline::Kind::one_f_one_b || kind == pipeline::Kind::interleaved;
    return periodic ? std::min(m, 3 * P) : m;
}

}  // namespace

std::vector<InFlight> in_flight(pipeline::Kind kind, int P, int v, int m) {
    std::vector<InFlight> stages;
    for (const std::vector<pipeline::Instr>& stream :
         pipeline::schedules(kind, P, v, microbatches_walked(kind, P, m)))
        stages.push_back(walk(stream, v));
    return stages;
}

std::vector<InFlight> in_flight(const config::Config& cfg) {
    const auto& p = cfg.parallel;
    return in_flight(p.schedule, p.pipeline, p.virtual_stages, cfg.derived.grad_accum_steps);
}

}  // namespace trident::plan
