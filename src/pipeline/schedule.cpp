// The schedules as instruction streams (schedule.h). Each is built in two passes: first the
// order of compute (forward, backward or its B and W parts, of (microbatch, chunk)), which is
// all that tells the schedules apart, then the communication around it, which follows from
// where chunks live:
// a receive right before the compute that needs it, a send right after the compute that
// produces it. Sends are buffered, so sending early never blocks; receiving late (just in
// time) never holds up work the stage could have done.
#include "pipeline/schedule.h"

#include <algorithm>
#include <bit>
#include <deque>
#include <sstream>

#include "kernels/error.h"

namespace trident::pipeline {

namespace {

template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
    std::ostringstream out;
    out << "pipeline: ";
    (out << ... << args);
    throw Error(out.str());
}

void validate(Kind kind, int P, int v, int m, int stage) {
    if (P < 1) fail("parallel.pipeline must be at least 1 (got ", P, ")");
    if (m < 1) fail("the microbatches per step must be at least 1 (got ", m, ")");
    if (stage < 0 || stage >= P)
        fail("stage ", stage, " is outside the pipeline's stages 0 .. ", P - 1);
    if (kind == Kind::interleaved) {
        if (v < 2)
            fail("the interleaved schedule needs parallel.virtual_stages >= 2 (got ", v,
                 "); use 1f1b for one chunk per stage");
        if (m % P != 0)
            fail("the interleaved schedule needs the microbatches per step (", m,
                 ") to be a multiple of parallel.pipeline (", P, ")");
    } else if (kind == Kind::zb_v) {
        if (P < 2) fail("the zb-v schedule needs parallel.pipeline >= 2 (got ", P, ")");
        if (v != 2)
            fail(
                "the zb-v schedule runs two chunks per stage; parallel.virtual_stages must be 2 "
                "(got ",
                v, ")");
    } else if (v != 1) {
        fail("the ", to_string(kind),
             " schedule runs one chunk per stage; parallel.virtual_stages must be 1 (got ", v,
             ") or the schedule interleaved");
    }
}

struct Work {
    Op op;  // forward, backward, backward_input or backward_weight
    int microbatch;
    int chunk;
};

// Interleaved 1F1B numbers its work by virtual microbatch k: microbatches go in groups of P,
// each group through chunk 0, then chunk 1, ..., so k = 0 .. m·v-1 covers (microbatch, chunk)
// pairs in the order group, chunk, microbatch within the group. Backwards walk the chunks in
// the opposite order, since the gradient enters at the last chunk.
Work virtual_work(bool forward, int k, int P, int v) {
    const int group = k / (P * v);
    const int chunk_in_order = (k / P) % v;
    return {forward ? Op::forward : Op::backward, group * P + k % P,
            forward ? chunk_in_order : v - 1 - chunk_in_order};
}

// A stage in the zero-bubble replay (below), times in units of one op, per local chunk c:
// forwards[c] and inputs[c] count its F and B done (each in microbatch order), act_ready[c][k]
// and grad_ready[c][k] say when F and B of microbatch k can start (their input arrived).
struct ReplayStage {
    std::vector<int> forwards, inputs;
    std::vector<std::vector<double>> act_ready, grad_ready;
    std::deque<Work> pending;  // B done, W not yet: in the order of the B's
    int held = 0;              // chunks forwarded, W not yet done
    double clock = 0;
    bool last_was_forward = false;
    std::vector<Work> order;
};

constexpr double kNever = 1e300;

// When chunk c's next F (forward) or B could start on stage s; kNever when there is none.
double ready_at(const ReplayStage& s, std::size_t c, int m, bool forward) {
    const int k = forward ? s.forwards[c] : s.inputs[c];
    if (forward ? k >= m : k >= s.forwards[c]) return kNever;
    return (forward ? s.act_ready : s.grad_ready)[c][static_cast<std::size_t>(k)];
}

// Stage s's next F or B: the one ready first; of two ready by `now`, the F of the later
// chunk (its microbatch nearer the loss), the B of the earlier (nearer the end).
Work next_of(const ReplayStage& s, int m, bool forward, double now, double& at) {
    const std::size_t v = s.forwards.size();
    Work best{forward ? Op::forward : Op::backward_input, -1, -1};
    at = kNever;
    for (std::size_t i = 0; i < v; ++i) {
        const std::size_t c = forward ? v - 1 - i : i;
        const double t = ready_at(s, c, m, forward);
        if (t < at && (at > now || best.chunk < 0)) {
            at = t;
            best.chunk = static_cast<int>(c);
            best.microbatch = forward ? s.forwards[c] : s.inputs[c];
        }
    }
    return best;
}

// When stage s could start its next op, and which (kNever: it waits for what no stage has
// computed yet, or it is done).
double next_start(const ReplayStage& s, int m, int limit, Work& work) {
    double f = kNever, b = kNever;
    const Work forward = next_of(s, m, true, s.clock, f);
    const Work input = next_of(s, m, false, s.clock, b);
    if (s.held >= limit) f = kNever;
    const bool f_now = f <= s.clock, b_now = b <= s.clock;
    if (f_now && b_now) {
        work = s.last_was_forward ? input : forward;
        return s.clock;
    }
    if (f_now || b_now) {
        work = f_now ? forward : input;
        return s.clock;
    }
    if (!s.pending.empty()) {
        work = s.pending.front();
        return s.clock;
    }
    work = f < b ? forward : input;
    return std::min(f, b);
}

// Stage i runs `w` from `start`: it joins the stage's order, and what it produces (an F's
// activation, a B's gradient) reaches the stage holding the neighbouring chunk when it ends.
// Returns the stage it reached (-1: none, the loss or the embedding).
int replay_op(std::vector<ReplayStage>& stages, const model::ChunkMap& map, int i, const Work& w,
              double start) {
    ReplayStage& s = stages[static_cast<std::size_t>(i)];
    const std::size_t c = static_cast<std::size_t>(w.chunk),
                      k = static_cast<std::size_t>(w.microbatch);
    const int g = map.global(i, w.chunk);
    s.clock = start + 1.0;
    s.order.push_back(w);
    const auto reach = [&](int to, bool grad) {
        const int t = map.stage_of(to);
        ReplayStage& target = stages[static_cast<std::size_t>(t)];
        (grad ? target.grad_ready : target.act_ready)[static_cast<std::size_t>(map.local(to))][k] =
            s.clock;
        return t;
    };
    if (w.op == Op::forward) {
        ++s.forwards[c];
        ++s.held;
        s.last_was_forward = true;
        if (g < map.last()) return reach(g + 1, false);
        s.grad_ready[c][k] = s.clock;  // the loss: its B may follow
    } else if (w.op == Op::backward_input) {
        ++s.inputs[c];
        s.last_was_forward = false;
        s.pending.push_back({Op::backward_weight, w.microbatch, w.chunk});
        if (g > 0) return reach(g - 1, true);
    } else {
        --s.held;
        s.pending.pop_front();
    }
    return -1;
}

// The stages' next starts as a tournament: each inner node holds the earlier of its two
// children (of equal ones, the lower stage), so the earliest is at the root and a change is
// carried up in log P steps.
class Earliest {
public:
    explicit Earliest(std::size_t stages)
        : leaves_(std::bit_ceil(std::max<std::size_t>(stages, 1))) {
        start_.assign(leaves_, kNever);
        winner_.assign(2 * leaves_, 0);
        for (std::size_t i = 0; i < leaves_; ++i) winner_[leaves_ + i] = i;
        for (std::size_t n = leaves_; n-- > 1;) winner_[n] = play(2 * n, 2 * n + 1);
    }
    void set(std::size_t stage, double start) {
        start_[stage] = start;
        for (std::size_t n = (leaves_ + stage) / 2; n >= 1; n /= 2)
            winner_[n] = play(2 * n, 2 * n + 1);
    }
    std::size_t stage() const { return winner_[1]; }
    double start() const { return start_[winner_[1]]; }

private:
    std::size_t play(std::size_t a, std::size_t b) const {
        return start_[winner_[b]] < start_[winner_[a]] ? winner_[b] : winner_[a];
    }
    std::size_t leaves_;
    std::vector<double> start_;
    std::vector<std::size_t> winner_;
};

// The zero-bubble orders of every stage, by replaying the pipeline with unit costs: each
// stage, when free, runs a B or an F that is ready (alternating when both are; an F only
// while it holds fewer than `limit` chunks' activations, which W frees), else its oldest
// pending W, else waits for the next message. The stage that can start earliest goes first,
// so the replay follows time (of two at once, the lower stage). A stage's next start changes
// only when it runs an op or a message reaches it, so only those two are looked at again.
std::vector<std::vector<Work>> zero_bubble_orders(const model::ChunkMap& map, int m, int limit) {
    const std::size_t v = static_cast<std::size_t>(map.chunks), mbs = static_cast<std::size_t>(m);
    const std::size_t P = static_cast<std::size_t>(map.stages);
    std::vector<ReplayStage> stages(P);
    for (ReplayStage& s : stages) {
        s.forwards.assign(v, 0);
        s.inputs.assign(v, 0);
        s.act_ready.assign(v, std::vector<double>(mbs, kNever));
        s.grad_ready.assign(v, std::vector<double>(mbs, kNever));
    }
    stages.front().act_ready.front().assign(mbs, 0.0);  // global chunk 0 embeds
    Earliest earliest(P);
    std::vector<Work> next(P);
    for (std::size_t i = 0; i < P; ++i) earliest.set(i, next_start(stages[i], m, limit, next[i]));
    while (earliest.start() < kNever) {
        const std::size_t chosen = earliest.stage();
        const int reached =
            replay_op(stages, map, static_cast<int>(chosen), next[chosen], earliest.start());
        earliest.set(chosen, next_start(stages[chosen], m, limit, next[chosen]));
        if (reached >= 0) {
            const auto r = static_cast<std::size_t>(reached);
            earliest.set(r, next_start(stages[r], m, limit, next[r]));
        }
    }
    std::vector<std::vector<Work>> orders;
    for (ReplayStage& s : stages) orders.push_back(std::move(s.order));
    return orders;
}

// Activations a zero-bubble schedule lets a stage hold, in chunks: ZB-H1 1F1B's P, ZB-H2
// 2P - 1, ZB-V 2P chunks of half a stage's layers (1F1B's P microbatches again).
int activation_limit(Kind kind, int P) {
    return kind == Kind::zb_h1 ? P : kind == Kind::zb_h2 ? 2 * P - 1 : 2 * P;
}

std::vector<Work> compute_order(Kind kind, int P, int v, int m, int stage) {
    std::vector<Work> order;
    if (kind == Kind::gpipe) {
        for (int mb = 0; mb < m; ++mb) order.push_back({Op::forward, mb, 0});
        for (int mb = 0; mb < m; ++mb) order.push_back({Op::backward, mb, 0});
        return order;
    }
    if (splits_backward(kind))
        return zero_bubble_orders(chunk_map(kind, P, v), m,
                                  activation_limit(kind, P))[static_cast<std::size_t>(stage)];
    // 1F1B and interleaved share one shape over "units" (microbatches, or virtual
    // microbatches): warm-up forwards, then forward one / backward one, then the cool-down
    // backwards. Units are forwarded and backwarded in the same order.
    const int units = kind == Kind::interleaved ? m * v : m;
    const int warmup = warmup_forwards(kind, P, v, m, stage);
    auto unit = [&](bool forward, int k) {
        return kind == Kind::interleaved ? virtual_work(forward, k, P, v)
                                         : Work{forward ? Op::forward : Op::backward, k, 0};
    };
    for (int k = 0; k < warmup; ++k) order.push_back(unit(true, k));
    for (int k = 0; k < units - warmup; ++k) {
        order.push_back(unit(true, warmup + k));
        order.push_back(unit(false, k));
    }
    for (int k = units - warmup; k < units; ++k) order.push_back(unit(false, k));
    return order;
}

}  // namespace

int warmup_forwards(Kind kind, int P, int v, int m, int stage) {
    switch (kind) {
        case Kind::gpipe:
            return m;
        case Kind::zb_h1:
        case Kind::zb_h2:
        case Kind::zb_v: {
            const std::vector<Work> order = compute_order(kind, P, v, m, stage);
            return static_cast<int>(
                std::find_if(order.begin(), order.end(),
                             [](const Work& w) { return w.op == Op::backward_input; }) -
                order.begin());
        }
        case Kind::one_f_one_b:
            // The last stage starts backwards at once; each stage before it has one more
            // microbatch in the pipe ahead of it (Megatron's count).
            return std::min(P - stage - 1, m);
        case Kind::interleaved:
            // Megatron's: all chunks but the last for the first group of P, plus two per
            // stage downstream (a forward and a backward hop per stage on the round trip).
            return std::min((P - stage - 1) * 2 + (v - 1) * P, m * v);
    }
    return 0;
}

namespace {

// The instructions of `stage` doing the passes of `order`, each with its messages.
std::vector<Instr> stream_of(const std::vector<Work>& order, const model::ChunkMap& map,
                             int stage) {
    const int last = map.last();  // the global chunk that ends with the loss
    std::vector<Instr> stream;
    for (const Work& w : order) {
        const int g = map.global(stage, w.chunk);
        const int mb = w.microbatch, c = w.chunk;
        if (w.op == Op::forward) {
            if (g > 0) stream.push_back({Op::recv_act, mb, c});
            stream.push_back({Op::forward, mb, c});
            if (g < last) stream.push_back({Op::send_act, mb, c});
        } else if (w.op == Op::backward_weight) {
            stream.push_back({Op::backward_weight, mb, c});
        } else {  // backward, or its B: the gradient comes in and goes on
            if (g < last) stream.push_back({Op::recv_grad, mb, c});
            stream.push_back({w.op, mb, c});
            if (g > 0) stream.push_back({Op::send_grad, mb, c});
        }
    }
    return stream;
}

}  // namespace

std::vector<Instr> schedule(Kind kind, int P, int v, int m, int stage) {
    validate(kind, P, v, m, stage);
    return stream_of(compute_order(kind, P, v, m, stage), chunk_map(kind, P, v), stage);
}

std::vector<std::vector<Instr>> schedules(Kind kind, int P, int v, int m) {
    validate(kind, P, v, m, 0);
    std::vector<std::vector<Instr>> streams;
    if (!splits_backward(kind)) {
        for (int s = 0; s < P; ++s) streams.push_back(schedule(kind, P, v, m, s));
        return streams;
    }
    // The zero-bubble orders come from one replay of every stage: made once, not per stage.
    const model::ChunkMap map = chunk_map(kind, P, v);
    const auto orders = zero_bubble_orders(map, m, activation_limit(kind, P));
    for (int s = 0; s < P; ++s)
        streams.push_back(stream_of(orders[static_cast<std::size_t>(s)], map, s));
    return streams;
}

double bubble_formula(Kind kind, int P, int v, int m) {
    if (kind == Kind::zb_v) return (P - 1) / (6.0 * m);     // (P-1)F / 2m(F+B+W)
    if (splits_backward(kind)) return (P - 1) / (3.0 * m);  // (P-1)(F+B-W) / m(F+B+W)
    const double chunks = kind == Kind::interleaved ? v : 1;
    return (P - 1) / (chunks * m);
}

bool splits_backward(Kind kind) {
    return kind == Kind::zb_h1 || kind == Kind::zb_h2 || kind == Kind::zb_v;
}

const char* to_string(Op op) {
    switch (op) {
        case Op::forward:
            return "forward";
        case Op::backward:
            return "backward";
        case Op::backward_input:
            return "backward_input";
        case Op::backward_weight:
            return "backward_weight";
        case Op::send_act:
            return "send_act";
        case Op::recv_act:
            return "recv_act";
        case Op::send_grad:
            return "send_grad";
        case Op::recv_grad:
            return "recv_grad";
    }
    return "?";
}

const char* to_string(Kind kind) {
    switch (kind) {
        case Kind::gpipe:
            return "gpipe";
        case Kind::one_f_one_b:
            return "1f1b";
        case Kind::interleaved:
            return "interleaved";
        case Kind::zb_h1:
            return "zb-h1";
        case Kind::zb_h2:
            return "zb-h2";
        case Kind::zb_v:
            return "zb-v";
    }
    return "?";
}

Kind parse_kind(std::string_view name) {
    for (Kind kind :
         {Kind::gpipe, Kind::one_f_one_b, Kind::interleaved, Kind::zb_h1, Kind::zb_h2, Kind::zb_v})
        if (name == to_string(kind)) return kind;
    fail("unknown schedule '", name, "' (expected gpipe, 1f1b, interleaved, zb-h1, zb-h2 or zb-v)");
}

}  // namespace trident::pipeline
