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
// A chunk's neighbour outside 0 .. last (a malformed stream's) is said to be on stage -1.
Message message_of(const Instr& in, const model::ChunkMap& map, int stage) {
    const int g = map.global(stage, in.chunk);
    const auto stage_of = [&](int h) { return h < 0 || h > map.last() ? -1 : map.stage_of(h); };
    switch (in.op) {
        case Op::send_act:
            return {false, in.microbatch, g + 1, stage};
        case Op::recv_act:
            return {false, in.microbatch, g, stage_of(g - 1)};
        case Op::send_grad:
            return {true, in.microbatch, g - 1, stage};
        case Op::recv_grad:
            return {true, in.microbatch, g, stage_of(g + 1)};
        default:
            return {false, -1, -1, -1};
    }
}

// The instruction on the other end of a message, and its stage (for "expected ..." hints).
std::pair<int, Instr> counterpart(const Message& msg, const model::ChunkMap& map,
                                  bool is_sender_side) {
    const Op op = msg.grad ? (is_sender_side ? Op::recv_grad : Op::send_grad)
                           : (is_sender_side ? Op::recv_act : Op::send_act);
    // The receiver holds msg.to_chunk; the sender holds its neighbour.
    const int g = is_sender_side ? msg.to_chunk : (msg.grad ? msg.to_chunk + 1 : msg.to_chunk - 1);
    if (g < 0 || g > map.last()) return {-1, Instr{op, msg.microbatch, -1}};
    return {map.stage_of(g), Instr{op, msg.microbatch, map.local(g)}};
}

// What one stage has done to one (microbatch, chunk) so far. A backward split into B and W
// is backwarded (its gradient flows on) at B and finished (its activations freed) at W.
struct ChunkState {
    bool forwarded = false, backwarded = false, weights_pending = false;
    bool act_received = false, act_sent = false;
    bool grad_received = false, grad_sent = false;
};

// Checks instruction `in` against what its stage has done to its (microbatch, chunk), `st`,
// global chunk g of the last one `last`, and records it there; `problem` takes each problem.
template <typename Problem>
void check_instruction(const Instr& in, int g, int last, ChunkState& st, Problem&& problem) {
    switch (in.op) {
        case Op::forward:
            if (st.forwarded) problem("forwarded twice");
            if (g > 0 && !st.act_received) problem("no recv_act before it for its input");
            st.forwarded = true;
            break;
        case Op::backward:
        case Op::backward_input:
            if (!st.forwarded) problem("backward before its forward");
            if (st.backwarded) problem("backwarded twice");
            if (g < last && !st.grad_received)
                problem("no recv_grad before it for its output's gradient");
            st.backwarded = true;
            st.weights_pending = in.op == Op::backward_input;
            break;
        case Op::backward_weight:
            if (!st.backwarded || !st.weights_pending)
                problem("weight gradients without a backward_input before them");
            st.weights_pending = false;
            break;
        case Op::recv_act:
            if (g == 0) problem("global chunk 0 takes the embedding, not a received input");
            if (st.act_received) problem("received twice");
            if (st.forwarded) problem("received after its forward");
            st.act_received = true;
            break;
        case Op::send_act:
            if (g == last) problem("the last global chunk has no next chunk to send to");
            if (!st.forwarded) problem("sent before its forward");
            if (st.act_sent) problem("sent twice");
            st.act_sent = true;
            break;
        case Op::recv_grad:
            if (g == last) problem("the last global chunk's gradient comes from the loss");
            if (st.grad_received) problem("received twice");
            if (st.backwarded) problem("received after its backward");
            st.grad_received = true;
            break;
        case Op::send_grad:
            if (g == 0) problem("global chunk 0 has no previous chunk to send a gradient to");
            if (!st.backwarded) problem("sent before its backward");
            if (st.grad_sent) problem("sent twice");
            st.grad_sent = true;
            break;
    }
}

// What a stage's stream left undone to microbatch mb's chunk c, in state `st`.
void check_finished(const ChunkState& st, const model::ChunkMap& map, int stage, int mb, int c,
                    std::vector<std::string>& problems) {
    const int last = map.last();
    const int g = map.global(stage, c);
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

void check_stage(const std::vector<Instr>& stream, const model::ChunkMap& map, int m, int stage,
                 std::vector<std::string>& problems) {
    const int last = map.last(), v = map.chunks;
    std::vector<ChunkState> state(static_cast<std::size_t>(m) * v);
    for (std::size_t i = 0; i < stream.size(); ++i) {
        const Instr& in = stream[i];
        const auto problem = [&](const std::string& what) {
            problems.push_back(where(stage, i, in) + ": " + what);
        };
        if (in.microbatch < 0 || in.microbatch >= m) {
            problem("microbatch outside 0 .. " + std::to_string(m - 1));
            continue;
        }
        if (in.chunk < 0 || in.chunk >= v) {
            problem("chunk outside 0 .. " + std::to_string(v - 1));
            continue;
        }
        ChunkState& st = state[static_cast<std::size_t>(in.microbatch) * v + in.chunk];
        check_instruction(in, map.global(stage, in.chunk), last, st, problem);
    }
    for (int mb = 0; mb < m; ++mb)
        for (int c = 0; c < v; ++c)
            check_finished(state[static_cast<std::size_t>(mb) * v + c], map, stage, mb, c,
                           problems);
}

// Every send matched by one receive and every receive by one send.
void check_matching(const std::vector<std::vector<Instr>>& streams, const model::ChunkMap& map,
                    int m, std::vector<std::string>& problems) {
    const int P = map.stages, v = map.chunks;
    std::map<Message, std::vector<std::pair<int, std::size_t>>> sends, receives;
    for (int s = 0; s < P; ++s)
        for (std::size_t i = 0; i < streams[s].size(); ++i) {
            const Instr& in = streams[s][i];
            if (in.microbatch < 0 || in.microbatch >= m || in.chunk < 0 || in.chunk >= v) continue;
            if (is_send(in.op)) sends[message_of(in, map, s)].push_back({s, i});
            if (is_receive(in.op)) receives[message_of(in, map, s)].push_back({s, i});
        }
    auto unmatched = [&](const auto& mine, const auto& theirs, bool sender_side) {
        for (const auto& [msg, at] : mine) {
            const auto it = theirs.find(msg);
            const std::size_t matches = it == theirs.end() ? 0 : it->second.size();
            for (std::size_t k = matches; k < at.size(); ++k) {
                const auto [stage, index] = at[k];
                const auto [other_stage, other] = counterpart(msg, map, sender_side);
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

// Whether a compute instruction's output leaves the stage (and so takes a send buffer; one
// for the stage itself, at the V's turn, is handed over at once).
bool output_is_sent(const Instr& in, const model::ChunkMap& map, int stage) {
    const int g = map.global(stage, in.chunk);
    if (in.op == Op::backward_weight) return false;
    const int to = in.op == Op::forward ? g + 1 : g - 1;
    return to >= 0 && to <= map.last() && map.stage_of(to) != stage;
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

// The replay in time of every stage's stream (see the top of this file), into `sim`, whose
// stages are sized already.
class Replayer {
public:
    Replayer(const std::vector<std::vector<Instr>>& streams, const model::ChunkMap& map,
             const Costs& costs, Simulation& sim)
        : streams_(streams), map_(map), P_(sim.P), costs_(costs), sim_(sim), replay_(sim.P) {}

    // Runs the stages round-robin until a full round makes no progress.
    void run() {
        for (bool progress = true; progress;) {
            progress = false;
            for (int s = 0; s < P_; ++s)
                for (Replay& r = replay_[s]; r.next < streams_[s].size() && step(s); ++r.next)
                    progress = true;
        }
    }

    // Each stage's finish, the makespan, and for the stages left waiting, the deadlock.
    void conclude() {
        std::ostringstream waits;
        for (int s = 0; s < P_; ++s) {
            StageTrace& trace = sim_.stages[s];
            const Replay& r = replay_[s];
            trace.finish = r.clock;
            trace.done = r.next == streams_[s].size();
            sim_.makespan = std::max(sim_.makespan, trace.finish);
            if (trace.done) continue;
            if (sim_.deadlock) waits << "; ";
            sim_.deadlock = true;
            // Stages after s have no `done` yet: a wait for one of them is described
            // without "(which has finished)".
            describe_wait(s, waits);
        }
        if (sim_.deadlock) sim_.deadlock_detail = "deadlock: " + waits.str();
    }

private:
    // Runs stage s's next instruction; false when it must wait instead (for a message not
    // sent yet, or for a send buffer).
    bool step(int s) {
        Replay& r = replay_[s];
        const Instr& in = streams_[s][r.next];
        if (is_send(in.op)) {
            mailbox_[message_of(in, map_, s)].push_back(r.clock + costs_.latency);
            if (r.filled > 0) {
                --r.filled;
                r.unreceived.push_back(message_of(in, map_, s));
            }
            return true;
        }
        if (is_receive(in.op)) {
            const auto it = mailbox_.find(message_of(in, map_, s));
            if (it == mailbox_.end() || it->second.empty()) return false;  // not sent yet
            r.clock = std::max(r.clock, it->second.front());
            it->second.pop_front();
            received_[message_of(in, map_, s)] = r.clock;
            return true;
        }
        return compute(s, in);
    }

    // A compute instruction: false when its output needs a send buffer and none is free.
    bool compute(int s, const Instr& in) {
        Replay& r = replay_[s];
        StageTrace& trace = sim_.stages[s];
        r.waits_for_buffer = false;
        if (output_is_sent(in, map_, s)) {
            const int taken = r.filled + static_cast<int>(r.unreceived.size());
            if (costs_.send_buffers > 0 && taken >= costs_.send_buffers && !free_a_buffer(r)) {
                r.waits_for_buffer = true;
                return false;
            }
            ++r.filled;
            trace.peak_send_buffers =
                std::max(trace.peak_send_buffers, r.filled + static_cast<int>(r.unreceived.size()));
        }
        const double cost = cost_of(in.op, costs_);
        trace.spans.push_back({in.op, in.microbatch, in.chunk, r.clock, r.clock + cost});
        r.clock += cost;
        trace.busy += cost;
        hold_activations(r, in);
        trace.peak_in_flight = std::max(trace.peak_in_flight, static_cast<int>(r.held.size()));
        trace.peak_in_flight_microbatches = std::max(
            trace.peak_in_flight_microbatches, static_cast<int>(r.held_per_microbatch.size()));
        return true;
    }

    // Activations stay until the backward, or its W, is done.
    static void hold_activations(Replay& r, const Instr& in) {
        const bool forward = in.op == Op::forward;
        const std::pair key{in.microbatch, in.chunk};
        if (forward && r.held.insert(key).second) {
            ++r.held_per_microbatch[in.microbatch];
        } else if (in.op != Op::backward_input && !forward && r.held.erase(key) == 1) {
            if (--r.held_per_microbatch[in.microbatch] == 0)
                r.held_per_microbatch.erase(in.microbatch);
        }
    }

    // Frees the stage's send buffer whose message was received first, if any was: the
    // buffer is free from then on. False when none of its messages has been received yet.
    bool free_a_buffer(Replay& r) {
        auto first = r.unreceived.end();
        for (auto it = r.unreceived.begin(); it != r.unreceived.end(); ++it) {
            const auto at = received_.find(*it);
            if (at != received_.end() &&
                (first == r.unreceived.end() || at->second < received_.at(*first)))
                first = it;
        }
        if (first == r.unreceived.end()) return false;
        r.clock = std::max(r.clock, received_.at(*first));
        r.unreceived.erase(first);
        return true;
    }

    // What unfinished stage s waits for: a send buffer, or a message from another stage.
    void describe_wait(int s, std::ostringstream& waits) const {
        const Replay& r = replay_[s];
        const Instr& in = streams_[s][r.next];
        if (r.waits_for_buffer) {
            waits << "stage " << s << " waits at instruction " << r.next << " " << describe(in)
                  << " for one of its " << costs_.send_buffers
                  << " send buffers (none of their messages received)";
            return;
        }
        const Message msg = message_of(in, map_, s);
        const auto [from, send] = counterpart(msg, map_, false);
        waits << "stage " << s << " waits at instruction " << r.next << " " << describe(in)
              << " for " << describe(send) << " from stage " << from;
        if (from >= 0 && from < P_ && sim_.stages[from].done) waits << " (which has finished)";
    }

    const std::vector<std::vector<Instr>>& streams_;
    const model::ChunkMap map_;
    const int P_;
    const Costs& costs_;
    Simulation& sim_;
    std::vector<Replay> replay_;
    std::map<Message, std::deque<double>> mailbox_;  // when each sent message can be received
    std::map<Message, double> received_;             // when each received message was
};

}  // namespace

std::vector<std::string> check_streams(const std::vector<std::vector<Instr>>& streams, int v, int m,
                                       model::Placement placement) {
    std::vector<std::string> problems;
    const int P = static_cast<int>(streams.size());
    if (P < 1 || v < 1 || m < 1) {
        problems.push_back("no stages, chunks or microbatches to check");
        return problems;
    }
    const model::ChunkMap map{placement, P, v};
    for (int s = 0; s < P; ++s) check_stage(streams[s], map, m, s, problems);
    check_matching(streams, map, m, problems);
    return problems;
}

Simulation simulate(const std::vector<std::vector<Instr>>& streams, int v, int m,
                    const Costs& costs, model::Placement placement) {
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
    sim.problems = check_streams(streams, v, m, placement);
    sim.stages.resize(sim.P);
    Replayer replayer(streams, {placement, sim.P, v}, costs, sim);
    replayer.run();
    replayer.conclude();
    sim.ideal = static_cast<double>(m) * v * (costs.forward + costs.backward);
    sim.bubble_fraction = (sim.makespan - sim.ideal) / sim.ideal;
    return sim;
}

Simulation simulate(Kind kind, int P, int v, int m, const Costs& costs) {
    Simulation sim = simulate(schedules(kind, P, v, m), v, m, costs, placement(kind));
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
