// The pipeline simulator (simulator.h): static checks of the streams, then a replay in time.
//
// The replay visits the stages round-robin, running each until it meets a receive whose
// message has not been sent yet. A stage's clock only depends on its own work and on when its
// messages became available, so the order of visits does not change any time it computes;
// when a full round makes no progress and some stage is unfinished, nothing ever will.
#include "pipeline/simulator.h"

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "kernels/error.h"

namespace trident::pipeline {

namespace {

bool is_send(Op op) {
    return op == Op::send_act || op == Op::send_grad;
}
bool is_receive(Op op) {
    return op == Op::recv_act || op == Op::recv_grad;
}

int positive_mod(int a, int n) {
    return ((a % n) + n) % n;
}

std::string describe(const Instr& in) {
    std::ostringstream out;
    out << to_string(in.op) << "(mb " << in.microbatch << ", chunk " << in.chunk << ")";
    return out.str();
}

std::string where(int stage, std::size_t index, const Instr& in) {
    std::ostringstream out;
    out << "stage " << stage << ", instruction " << index << " " << describe(in);
    return out.str();
}

// A message names what it carries and where it goes: activation or gradient, microbatch,
// and the global chunk it is for (the receiver's). With the sender's stage this identifies
// one send and one receive in a valid schedule.
struct Message {
    bool grad;
    int microbatch;
    int to_chunk;    // global chunk of the receiver
    int from_stage;  // stage of the sender

    auto operator<=>(const Message&) const = default;
};

// The message a send or receive instruction of `stage` refers to.
Message message_of(const Instr& in, int P, int stage) {
    const int g = global_chunk(P, stage, in.chunk);
    switch (in.op) {
        case Op::send_act:
            return {false, in.microbatch, g + 1, stage};
        case Op::recv_act:
            return {false, in.microbatch, g, positive_mod(g - 1, P)};
        case Op::send_grad:
            return {true, in.microbatch, g - 1, stage};
        case Op::recv_grad:
            return {true, in.microbatch, g, positive_mod(g + 1, P)};
        default:
            return {false, -1, -1, -1};
    }
}

// The instruction on the other end of a message, and its stage (for "expected ..." hints).
std::pair<int, Instr> counterpart(const Message& msg, int P, bool is_sender_side) {
    const Op op = msg.grad ? (is_sender_side ? Op::recv_grad : Op::send_grad)
                           : (is_sender_side ? Op::recv_act : Op::send_act);
    // The receiver holds msg.to_chunk; the sender holds its neighbour.
    const int g = is_sender_side ? msg.to_chunk : (msg.grad ? msg.to_chunk + 1 : msg.to_chunk - 1);
    const int stage = positive_mod(g, P);
    return {stage, Instr{op, msg.microbatch, g >= 0 ? g / P : -1}};
}

// What one stage has done to one (microbatch, chunk) so far. A backward split into B and W
// is backwarded (its gradient flows on) at B and finished (its activations freed) at W.
struct ChunkState {
    bool forwarded = false, backwarded = false, weights_pending = false;
    bool act_received = false, act_sent = false;
    bool grad_received = false, grad_sent = false;
};

void check_stage(const std::vector<Instr>& stream, int P, int v, int m, int stage,
                 std::vector<std::string>& problems) {
    const int last = P * v - 1;
    std::vector<ChunkState> state(static_cast<std::size_t>(m) * v);
    auto problem = [&](std::size_t i, const std::string& what) {
        problems.push_back(where(stage, i, stream[i]) + ": " + what);
    };
    for (std::size_t i = 0; i < stream.size(); ++i) {
        const Instr& in = stream[i];
        if (in.microbatch < 0 || in.microbatch >= m) {
            problem(i, "microbatch outside 0 .. " + std::to_string(m - 1));
            continue;
        }
        if (in.chunk < 0 || in.chunk >= v) {
            problem(i, "chunk outside 0 .. " + std::to_string(v - 1));
            continue;
        }
        ChunkState& st = state[static_cast<std::size_t>(in.microbatch) * v + in.chunk];
        const int g = global_chunk(P, stage, in.chunk);
        switch (in.op) {
            case Op::forward:
                if (st.forwarded) problem(i, "forwarded twice");
                if (g > 0 && !st.act_received) problem(i, "no recv_act before it for its input");
                st.forwarded = true;
                break;
            case Op::backward:
            case Op::backward_input:
                if (!st.forwarded) problem(i, "backward before its forward");
                if (st.backwarded) problem(i, "backwarded twice");
                if (g < last && !st.grad_received)
                    problem(i, "no recv_grad before it for its output's gradient");
                st.backwarded = true;
                st.weights_pending = in.op == Op::backward_input;
                break;
            case Op::backward_weight:
                if (!st.backwarded || !st.weights_pending)
                    problem(i, "weight gradients without a backward_input before them");
                st.weights_pending = false;
                break;
            case Op::recv_act:
                if (g == 0) problem(i, "global chunk 0 takes the embedding, not a received input");
                if (st.act_received) problem(i, "received twice");
                if (st.forwarded) problem(i, "received after its forward");
                st.act_received = true;
                break;
            case Op::send_act:
                if (g == last) problem(i, "the last global chunk has no next chunk to send to");
                if (!st.forwarded) problem(i, "sent before its forward");
                if (st.act_sent) problem(i, "sent twice");
                st.act_sent = true;
                break;
            case Op::recv_grad:
                if (g == last) problem(i, "the last global chunk's gradient comes from the loss");
                if (st.grad_received) problem(i, "received twice");
                if (st.backwarded) problem(i, "received after its backward");
                st.grad_received = true;
                break;
            case Op::send_grad:
                if (g == 0)
                    problem(i, "global chunk 0 has no previous chunk to send a gradient to");
                if (!st.backwarded) problem(i, "sent before its backward");
                if (st.grad_sent) problem(i, "sent twice");
                st.grad_sent = true;
                break;
        }
    }
    for (int mb = 0; mb < m; ++mb)
        for (int c = 0; c < v; ++c) {
            const ChunkState& st = state[static_cast<std::size_t>(mb) * v + c];
            const int g = global_chunk(P, stage, c);
            std::ostringstream what;
            what << "stage " << stage << ": microbatch " << mb << ", chunk " << c << " ";
            const std::string prefix = what.str();
            if (!st.forwarded) problems.push_back(prefix + "is never forwarded");
            if (!st.backwarded) problems.push_back(prefix + "is never backwarded");
            if (st.weights_pending)
                problems.push_back(prefix + "never gets its weight gradients (no backward_weight)");
            if (st.forwarded && g < last && !st.act_sent)
                problems.push_back(prefix + "never sends its output on (no send_act)");
            if (st.backwarded && g > 0 && !st.grad_sent)
                problems.push_back(prefix + "never sends its input's gradient back (no send_grad)");
        }
}

// Every send matched by one receive and every receive by one send.
void check_matching(const std::vector<std::vector<Instr>>& streams, int v, int m,
                    std::vector<std::string>& problems) {
    const int P = static_cast<int>(streams.size());
    std::map<Message, std::vector<std::pair<int, std::size_t>>> sends, receives;
    for (int s = 0; s < P; ++s)
        for (std::size_t i = 0; i < streams[s].size(); ++i) {
            const Instr& in = streams[s][i];
            if (in.microbatch < 0 || in.microbatch >= m || in.chunk < 0 || in.chunk >= v) continue;
            if (is_send(in.op)) sends[message_of(in, P, s)].push_back({s, i});
            if (is_receive(in.op)) receives[message_of(in, P, s)].push_back({s, i});
        }
    auto unmatched = [&](const auto& mine, const auto& theirs, bool sender_side) {
        for (const auto& [msg, at] : mine) {
            const auto it = theirs.find(msg);
            const std::size_t matches = it == theirs.end() ? 0 : it->second.size();
            for (std::size_t k = matches; k < at.size(); ++k) {
                const auto [stage, index] = at[k];
                const auto [other_stage, other] = counterpart(msg, P, sender_side);
                std::ostringstream what;
                what << where(stage, index, streams[stage][index]) << ": no matching "
                     << (sender_side ? "receive" : "send") << " (expected " << describe(other)
                     << " on stage " << other_stage << ")";
                problems.push_back(what.str());
            }
        }
    };
    unmatched(sends, receives, true);
    unmatched(receives, sends, false);
}

struct Replay {
    std::size_t next = 0;  // index of the next instruction
    double clock = 0.0;
    std::set<std::pair<int, int>> held;  // (microbatch, chunk) forwarded, not backwarded
    std::map<int, int> held_per_microbatch;
    int filled = 0;                   // send buffers computed into, not yet sent
    std::vector<Message> unreceived;  // sent from a send buffer, not yet received
    bool waits_for_buffer = false;    // blocked at a compute: every send buffer taken
};

// Whether a compute instruction's output leaves the stage (and so takes a send buffer).
bool output_is_sent(const Instr& in, int P, int v, int stage) {
    const int g = global_chunk(P, stage, in.chunk);
    if (in.op == Op::backward_weight) return false;
    return in.op == Op::forward ? g < P * v - 1 : g > 0;
}

double cost_of(Op op, const Costs& costs) {
    switch (op) {
        case Op::forward:
            return costs.forward;
        case Op::backward_input:
            return costs.backward - costs.weight;
        case Op::backward_weight:
            return costs.weight;
        default:
            return costs.backward;
    }
}

}  // namespace

std::vector<std::string> check_streams(const std::vector<std::vector<Instr>>& streams, int v,
                                       int m) {
    std::vector<std::string> problems;
    const int P = static_cast<int>(streams.size());
    if (P < 1 || v < 1 || m < 1) {
        problems.push_back("no stages, chunks or microbatches to check");
        return problems;
    }
    for (int s = 0; s < P; ++s) check_stage(streams[s], P, v, m, s, problems);
    check_matching(streams, v, m, problems);
    return problems;
}

Simulation simulate(const std::vector<std::vector<Instr>>& streams, int v, int m,
                    const Costs& costs) {
    if (costs.forward < 0 || costs.backward < 0 || costs.latency < 0 || costs.send_buffers < 0 ||
        costs.weight < 0 || costs.weight > costs.backward || costs.forward + costs.backward <= 0)
        throw Error(
            "pipeline: the simulator needs costs >= 0, weight <= backward and forward + "
            "backward > 0");
    Simulation sim;
    sim.P = static_cast<int>(streams.size());
    sim.v = v;
    sim.m = m;
    sim.costs = costs;
    sim.problems = check_streams(streams, v, m);
    sim.stages.resize(sim.P);

    const int P = sim.P;
    std::map<Message, std::deque<double>> mailbox;  // when each sent message can be received
    std::map<Message, double> received;             // when each received message was
    std::vector<Replay> replay(P);
    // Frees the stage's send buffer whose message was received first, if any was: the
    // buffer is free from then on. False when none of its messages has been received yet.
    const auto free_a_buffer = [&](Replay& r) {
        auto first = r.unreceived.end();
        for (auto it = r.unreceived.begin(); it != r.unreceived.end(); ++it) {
            const auto at = received.find(*it);
            if (at != received.end() &&
                (first == r.unreceived.end() || at->second < received.at(*first)))
                first = it;
        }
        if (first == r.unreceived.end()) return false;
        r.clock = std::max(r.clock, received.at(*first));
        r.unreceived.erase(first);
        return true;
    };
    for (bool progress = true; progress;) {
        progress = false;
        for (int s = 0; s < P; ++s) {
            Replay& r = replay[s];
            StageTrace& trace = sim.stages[s];
            const auto& stream = streams[s];
            for (; r.next < stream.size(); ++r.next, progress = true) {
                const Instr& in = stream[r.next];
                if (is_send(in.op)) {
                    mailbox[message_of(in, P, s)].push_back(r.clock + costs.latency);
                    if (r.filled > 0) {
                        --r.filled;
                        r.unreceived.push_back(message_of(in, P, s));
                    }
                } else if (is_receive(in.op)) {
                    const auto it = mailbox.find(message_of(in, P, s));
                    if (it == mailbox.end() || it->second.empty()) break;  // not sent yet
                    r.clock = std::max(r.clock, it->second.front());
                    it->second.pop_front();
                    received[message_of(in, P, s)] = r.clock;
                } else {
                    r.waits_for_buffer = false;
                    if (output_is_sent(in, P, v, s)) {
                        const int taken = r.filled + static_cast<int>(r.unreceived.size());
                        if (costs.send_buffers > 0 && taken >= costs.send_buffers &&
                            !free_a_buffer(r)) {
                            r.waits_for_buffer = true;
                            break;
                        }
                        ++r.filled;
                        trace.peak_send_buffers =
                            std::max(trace.peak_send_buffers,
                                     r.filled + static_cast<int>(r.unreceived.size()));
                    }
                    const bool forward = in.op == Op::forward;
                    const double cost = cost_of(in.op, costs);
                    trace.spans.push_back(
                        {in.op, in.microbatch, in.chunk, r.clock, r.clock + cost});
                    r.clock += cost;
                    trace.busy += cost;
                    const std::pair key{in.microbatch, in.chunk};
                    // Activations stay until the backward, or its W, is done.
                    if (forward && r.held.insert(key).second) {
                        ++r.held_per_microbatch[in.microbatch];
                    } else if (in.op != Op::backward_input && !forward && r.held.erase(key) == 1) {
                        if (--r.held_per_microbatch[in.microbatch] == 0)
                            r.held_per_microbatch.erase(in.microbatch);
                    }
                    trace.peak_in_flight =
                        std::max(trace.peak_in_flight, static_cast<int>(r.held.size()));
                    trace.peak_in_flight_microbatches =
                        std::max(trace.peak_in_flight_microbatches,
                                 static_cast<int>(r.held_per_microbatch.size()));
                }
            }
        }
    }

    std::ostringstream waits;
    for (int s = 0; s < P; ++s) {
        StageTrace& trace = sim.stages[s];
        trace.finish = replay[s].clock;
        trace.done = replay[s].next == streams[s].size();
        sim.makespan = std::max(sim.makespan, trace.finish);
        if (trace.done) continue;
        const Instr& in = streams[s][replay[s].next];
        if (sim.deadlock) waits << "; ";
        sim.deadlock = true;
        if (replay[s].waits_for_buffer) {
            waits << "stage " << s << " waits at instruction " << replay[s].next << " "
                  << describe(in) << " for one of its " << costs.send_buffers
                  << " send buffers (none of their messages received)";
            continue;
        }
        const Message msg = message_of(in, P, s);
        const auto [from, send] = counterpart(msg, P, false);
        waits << "stage " << s << " waits at instruction " << replay[s].next << " " << describe(in)
              << " for " << describe(send) << " from stage " << from;
        if (from >= 0 && from < P && sim.stages[from].done) waits << " (which has finished)";
    }
    if (sim.deadlock) sim.deadlock_detail = "deadlock: " + waits.str();
    sim.ideal = static_cast<double>(m) * v * (costs.forward + costs.backward);
    sim.bubble_fraction = (sim.makespan - sim.ideal) / sim.ideal;
    return sim;
}

Simulation simulate(Kind kind, int P, int v, int m, const Costs& costs) {
    std::vector<std::vector<Instr>> streams;
    for (int s = 0; s < std::max(P, 1); ++s)  // P < 1: schedule() says why
        streams.push_back(schedule(kind, P, v, m, s));
    Simulation sim = simulate(streams, v, m, costs);
    sim.kind = kind;
    return sim;
}

std::string Simulation::describe_problems() const {
    constexpr std::size_t shown = 20;
    std::string out;
    if (deadlock) out += deadlock_detail + "\n";
    for (std::size_t i = 0; i < problems.size() && i < shown; ++i) out += problems[i] + "\n";
    if (problems.size() > shown)
        out += "... and " + std::to_string(problems.size() - shown) + " more\n";
    return out;
}

void require_valid(const Simulation& sim) {
    if (sim.valid()) return;
    std::string text = sim.describe_problems();
    if (!text.empty() && text.back() == '\n') text.pop_back();
    throw Error("pipeline: the schedule is not valid:\n" + text);
}

}  // namespace trident::pipeline
