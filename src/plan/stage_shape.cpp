// Stage chunks and the in-flight walk of a schedule (see stage_shape.h).
#include "plan/stage_shape.h"

#include <algorithm>
#include <set>
#include <tuple>

#include "pipeline/executor.h"

namespace trident::plan {

std::vector<ChunkShape> stage_chunks(const config::Config& cfg, int stage) {
    const int P = cfg.parallel.pipeline, v = cfg.parallel.virtual_stages;
    const model::ChunkMap map = pipeline::chunk_map(cfg.parallel.schedule, P, v);
    std::vector<ChunkShape> chunks;
    for (int c = 0; c < v; ++c) {
        const int g = map.global(stage, c);
        chunks.push_back(
            {cfg.derived.chunk_layers[static_cast<std::size_t>(g)], g == 0, g == P * v - 1});
    }
    return chunks;
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
    std::set<std::tuple<int, int, int>> messages;
    int most_received = 0;
    bool sends = false;
    const auto hold = [&](int what, int mb, int c) {
        messages.insert({what, mb, c});
        most_received = std::max(most_received, static_cast<int>(messages.size()));
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

}  // namespace

std::vector<InFlight> in_flight(pipeline::Kind kind, int P, int v, int m) {
    std::vector<InFlight> stages;
    for (const std::vector<pipeline::Instr>& stream : pipeline::schedules(kind, P, v, m))
        stages.push_back(walk(stream, v));
    return stages;
}

std::vector<InFlight> in_flight(const config::Config& cfg) {
    const auto& p = cfg.parallel;
    return in_flight(p.schedule, p.pipeline, p.virtual_stages, cfg.derived.grad_accum_steps);
}

}  // namespace trident::plan
