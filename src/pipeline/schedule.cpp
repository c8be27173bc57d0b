// The three schedules as instruction streams (schedule.h). Each is built in two passes: first
// the order of compute (forward/backward of (microbatch, chunk)), which is all that tells the
// schedules apart, then the communication around it, which follows from where chunks live:
// a receive right before the compute that needs it, a send right after the compute that
// produces it. Sends are buffered, so sending early never blocks; receiving late (just in
// time) never holds up work the stage could have done.
#include "pipeline/schedule.h"

#include <algorithm>
#include <sstream>

#include "error.h"

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
    } else if (v != 1) {
        fail("the ", to_string(kind),
             " schedule runs one chunk per stage; parallel.virtual_stages must be 1 (got ", v,
             ") or the schedule interleaved");
    }
}

struct Work {
    bool forward;
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
    return {forward, group * P + k % P, forward ? chunk_in_order : v - 1 - chunk_in_order};
}

std::vector<Work> compute_order(Kind kind, int P, int v, int m, int stage) {
    std::vector<Work> order;
    if (kind == Kind::gpipe) {
        for (int mb = 0; mb < m; ++mb) order.push_back({true, mb, 0});
        for (int mb = 0; mb < m; ++mb) order.push_back({false, mb, 0});
        return order;
    }
    // 1F1B and interleaved share one shape over "units" (microbatches, or virtual
    // microbatches): warm-up forwards, then forward one / backward one, then the cool-down
    // backwards. Units are forwarded and backwarded in the same order.
    const int units = kind == Kind::interleaved ? m * v : m;
    const int warmup = warmup_forwards(kind, P, v, m, stage);
    auto unit = [&](bool forward, int k) {
        return kind == Kind::interleaved ? virtual_work(forward, k, P, v) : Work{forward, k, 0};
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

std::vector<Instr> schedule(Kind kind, int P, int v, int m, int stage) {
    validate(kind, P, v, m, stage);
    const int last = P * v - 1;  // the global chunk that ends with the loss
    std::vector<Instr> stream;
    for (const Work& w : compute_order(kind, P, v, m, stage)) {
        const int g = global_chunk(P, stage, w.chunk);
        const int mb = w.microbatch, c = w.chunk;
        if (w.forward) {
            if (g > 0) stream.push_back({Op::recv_act, mb, c});
            stream.push_back({Op::forward, mb, c});
            if (g < last) stream.push_back({Op::send_act, mb, c});
        } else {
            if (g < last) stream.push_back({Op::recv_grad, mb, c});
            stream.push_back({Op::backward, mb, c});
            if (g > 0) stream.push_back({Op::send_grad, mb, c});
        }
    }
    return stream;
}

double bubble_formula(Kind kind, int P, int v, int m) {
    const double chunks = kind == Kind::interleaved ? v : 1;
    return (P - 1) / (chunks * m);
}

const char* to_string(Op op) {
    switch (op) {
        case Op::forward:
            return "forward";
        case Op::backward:
            return "backward";
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
    }
    return "?";
}

Kind parse_kind(std::string_view name) {
    for (Kind kind : {Kind::gpipe, Kind::one_f_one_b, Kind::interleaved})
        if (name == to_string(kind)) return kind;
    fail("unknown schedule '", name, "' (expected gpipe, 1f1b or interleaved)");
}

}  // namespace trident::pipeline
