// The pipeline executor (see executor.h).
#include "pipeline/executor.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <thread>

#include "kernels/error.h"
#include "parallel/watchdog.h"

namespace trident::pipeline {

namespace {

// What a stage holds between receiving, computing and sending, keyed with the microbatch and
// the local chunk.
enum Message { act_in, act_out, grad_in, grad_out };

io::SpanKind span_of(Op op) {
    switch (op) {
        case Op::forward:
            return io::SpanKind::forward;
        case Op::backward:
            return io::SpanKind::backward;
        case Op::backward_input:
            return io::SpanKind::backward_input;
        case Op::backward_weight:
            return io::SpanKind::backward_weight;
        case Op::send_act:
        case Op::send_grad:
            return io::SpanKind::send;
        case Op::recv_act:
        case Op::recv_grad:
            break;
    }
    return io::SpanKind::recv;
}

}  // namespace

Executor::Executor(kernels::Ops& ops, model::Gpt& model, parallel::Comm& pipeline)
    : ops_(ops), model_(model), pipeline_(pipeline) {
    const std::size_t n =
        static_cast<std::size_t>(model.options().micro_batch) * model.local_tokens();
    inputs_.resize(n);
    targets_.resize(n);
}

kernels::Ptr Executor::received(int kind, int mb, int c) {
    auto [it, fresh] = received_.try_emplace(Key{kind, mb, c});
    if (fresh)
        it->second = kernels::DeviceBuffer(ops_, model_.boundary_size(),
                                           model_.options().precision.activations);
    return it->second.data();
}

kernels::Ptr Executor::take_send_buffer(int kind, int mb, int c) {
    const auto first_free = [&] {
        return std::find_if(send_slots_.begin(), send_slots_.end(),
                            [](const SendSlot& s) { return !s.taken; });
    };
    auto free = first_free();
    if (free == send_slots_.end() && static_cast<int>(send_slots_.size()) < kSendBuffers) {
        send_slots_.push_back(
            SendSlot{kernels::DeviceBuffer(ops_, model_.boundary_size(),
                                           model_.options().precision.activations),
                     {},
                     false});
        free = send_slots_.end() - 1;
    }
    // All taken: the first send to complete, whichever it is, frees its slot (the simulator's
    // rule: waiting on one in particular could wait on a receive that needs this stage first).
    // The watchdog sees a wait for the oldest send's peer.
    std::optional<parallel::Blocked> blocked;
    if (free == send_slots_.end() && !sending_.empty())
        blocked.emplace("send (waiting for a free send buffer)", pipeline_.label(),
                        send_slots_[static_cast<std::size_t>(sending_.front())].peer);
    while (free == send_slots_.end()) {
        if (sending_.empty())
            throw Error("internal: every pipeline send buffer is computed into and none is sent");
        for (auto it = sending_.begin(); it != sending_.end();) {
            SendSlot& slot = send_slots_[static_cast<std::size_t>(*it)];
            if (slot.sent.test()) {
                slot.taken = false;
                it = sending_.erase(it);
            } else {
                ++it;
            }
        }
        free = first_free();
        if (free == send_slots_.end()) std::this_thread::yield();
    }
    free->taken = true;
    outgoing_[Key{kind, mb, c}] = static_cast<int>(free - send_slots_.begin());
    return free->buffer.data();
}

void Executor::send(int kind, int mb, int c, int to_chunk, int tag) {
    const auto it = outgoing_.find(Key{kind, mb, c});
    if (it == outgoing_.end()) throw Error("internal: a pipeline send of nothing computed");
    SendSlot& slot = send_slots_[static_cast<std::size_t>(it->second)];
    const model::ChunkMap map = model_.layout().plan().map();
    const int peer = map.stage_of(to_chunk);
    if (peer == pipeline_.rank()) {
        // The V's turn (ZB-V): the chunk it goes to is this stage's; hand it over here, where
        // its receive will find it.
        const int received_as = kind == act_out ? act_in : grad_in;
        ops_.copy(received(received_as, mb, map.local(to_chunk)), slot.buffer.data(),
                  model_.boundary_size());
        slot.taken = false;
        outgoing_.erase(it);
        return;
    }
    slot.sent = pipeline_.isend(slot.buffer.data(), model_.boundary_size(), peer, tag);
    slot.peer = peer;
    sending_.push_back(it->second);
    outgoing_.erase(it);
}

// Messages between two stages are told apart by what they carry: the boundary they cross
// (from global chunk b to b + 1) and the microbatch; activations even, gradients odd.
int Executor::tag(int kind, int mb, int boundary) const {
    const model::StagePlan& plan = model_.layout().plan();
    const long long t =
        2LL * (static_cast<long long>(mb) * plan.stages * plan.chunks + boundary) + kind;
    if (t > std::numeric_limits<int>::max())
        throw Error("pipeline: too many microbatches per step for message tags");
    return static_cast<int>(t);
}

double Executor::run(const std::vector<Instr>& stream, const MicrobatchFn& microbatch, float dloss,
                     bool training, const SeedFn& dropout_seed) {
    const model::StagePlan& plan = model_.layout().plan();
    const model::ChunkMap map = plan.map();
    const int last_chunk = map.last();
    // A receive from this stage itself was handed over by its send (Executor::send).
    const auto receive = [&](kernels::Ptr into, int from_chunk, int tag) {
        const int peer = map.stage_of(from_chunk);
        if (peer != plan.stage) pipeline_.recv(into, model_.boundary_size(), peer, tag);
    };
    constexpr int kAct = 0, kGrad = 1;
    bool has_head = false;  // whether this rank computes the loss
    // Each chunk's last backward (or W) of the step completes its gradients.
    std::vector<std::size_t> last_backward(static_cast<std::size_t>(plan.chunks), stream.size());
    for (std::size_t i = 0; i < stream.size(); ++i)
        if (stream[i].op == Op::backward || stream[i].op == Op::backward_weight)
            last_backward[static_cast<std::size_t>(stream[i].chunk)] = i;

    for (std::size_t i = 0; i < stream.size(); ++i) {
        const Instr& in = stream[i];
        const int mb = in.microbatch, c = in.chunk, g = plan.global_chunk(c);
        const io::ScopedSpan span(trace_, span_of(in.op), mb, c);
        parallel::set_microbatch(mb);
        switch (in.op) {
            case Op::recv_act:
                receive(received(act_in, mb, c), g - 1, tag(kAct, mb, g - 1));
                break;
            case Op::forward: {
                const bool embeds = g == 0, head = g == last_chunk;
                // Under the document mask every chunk's attention reads the tokens' documents.
                if (embeds || head || model_.options().documents.mask)
                    microbatch(mb, inputs_, targets_);
                model_.forward_chunk(mb, c, inputs_.data(), targets_.data(),
                                     embeds ? kernels::ConstPtr() : received(act_in, mb, c),
                                     head ? kernels::Ptr() : take_send_buffer(act_out, mb, c),
                                     training, dropout_seed(mb));
                has_head = has_head || head;
                received_.erase(Key{act_in, mb, c});  // the model keeps its own copy
                break;
            }
            case Op::send_act:
                send(act_out, mb, c, g + 1, tag(kAct, mb, g));
                break;
            case Op::recv_grad:
                receive(received(grad_in, mb, c), g + 1, tag(kGrad, mb, g));
                break;
            case Op::backward:
                model_.backward_chunk(
                    mb, c, dloss, g == last_chunk ? kernels::ConstPtr() : received(grad_in, mb, c),
                    g == 0 ? kernels::Ptr() : take_send_buffer(grad_out, mb, c),
                    i == last_backward[static_cast<std::size_t>(c)]);
                received_.erase(Key{grad_in, mb, c});
                break;
            case Op::backward_input:
                model_.backward_input(
                    mb, c, dloss, g == last_chunk ? kernels::ConstPtr() : received(grad_in, mb, c),
                    g == 0 ? kernels::Ptr() : take_send_buffer(grad_out, mb, c));
                received_.erase(Key{grad_in, mb, c});
                break;
            case Op::backward_weight:
                model_.backward_weight(mb, c, i == last_backward[static_cast<std::size_t>(c)]);
                break;
            case Op::send_grad:
                send(grad_out, mb, c, g - 1, tag(kGrad, mb, g - 1));
                break;
        }
    }
    parallel::set_microbatch(-1);
    // Every send has completed once the step is over; the buffers stay for the next.
    for (const int slot : sending_) send_slots_[static_cast<std::size_t>(slot)].sent.wait();
    for (SendSlot& slot : send_slots_) slot.taken = false;
    sending_.clear();
    received_.clear();
    // The losses stayed on the device: one read for the whole step.
    return has_head ? model_.take_loss_sum() : 0.0;
}

std::vector<Instr> forward_only(const model::StagePlan& plan, int m) {
    // Microbatch by microbatch through the chunks in order: a receive always waits on a send
    // issued earlier in some stage's stream, so no stage can wait forever.
    std::vector<Instr> stream;
    const int last = plan.map().last();
    for (int mb = 0; mb < m; ++mb)
        for (int c = 0; c < plan.chunks; ++c) {
            const int g = plan.global_chunk(c);
            if (g > 0) stream.push_back({Op::recv_act, mb, c});
            stream.push_back({Op::forward, mb, c});
            if (g < last) stream.push_back({Op::send_act, mb, c});
        }
    return stream;
}

}  // namespace trident::pipeline
