// Replays every stage's instruction stream together, under the rules of schedule.h, to prove a
// schedule correct and to measure it: the time each compute instruction runs, the pipeline
// bubble, the activations each stage holds, and — for a broken schedule — the deadlock or the
// inconsistency, described so a person can find it.
//
// The model: every stage starts at time 0 and executes its stream in order. A forward of one
// chunk takes `forward`, a backward `backward`. A send completes at once (buffered) and its
// message can be received from time + latency on; a receive waits for its message (same kind,
// microbatch and global chunk, from the stage that holds the neighbouring chunk). Receiving and
// sending take no time of their own. Timings depend only on the streams, never on the order in
// which the replay visits the stages.
//
// Send buffers, as the executor holds them: a compute whose output goes to another stage
// writes it into one of the stage's `send_buffers`, which stays taken until the message has
// been received. With all taken, the compute waits for the first of its messages to be
// received (a send's buffer is free no sooner than that). A schedule that deadlocks so needs
// more buffers; 0 buffers means as many as the schedule wants.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "pipeline/schedule.h"

namespace trident::pipeline {

struct Costs {
    double forward = 1.0;   // one chunk's forward on one microbatch
    double backward = 2.0;  // its backward (about twice the forward's FLOPs)
    double latency = 0.0;   // from a send to when its receive can complete
    int send_buffers = 0;   // a stage's buffers for outgoing messages; 0: unbounded
    double weight = 1.0;    // of the backward, the W part (B costs backward - weight)
};

// One compute instruction as it ran.
struct Span {
    Op op;  // forward, backward, backward_input or backward_weight
    int microbatch;
    int chunk;  // local chunk
    double start;
    double end;
};

struct StageTrace {
    std::vector<Span> spans;  // compute instructions in the order they ran
    double finish = 0.0;      // when its last instruction completed
    double busy = 0.0;        // time spent computing
    bool done = false;        // it reached the end of its stream
    // Activations held: (microbatch, chunk) pairs forwarded whose backward has not yet run, at
    // their most; and the distinct microbatches among them (the same for v = 1).
    int peak_in_flight = 0;
    int peak_in_flight_microbatches = 0;
    int peak_send_buffers = 0;  // outgoing messages held at once: filled, sent, not received
};

struct Simulation {
    std::optional<Kind> kind;  // set when the streams came from schedule()
    int P = 0, v = 0, m = 0;
    Costs costs;
    std::vector<StageTrace> stages;
    double makespan = 0.0;         // when the last stage finished
    double ideal = 0.0;            // one stage's compute, m·v·(forward + backward)
    double bubble_fraction = 0.0;  // (makespan - ideal) / ideal, PTD-P's bubble

    bool deadlock = false;              // some stage could never finish
    std::string deadlock_detail;        // which stages wait, at which instruction, for whom
    std::vector<std::string> problems;  // inconsistencies in the streams (check_streams)

    bool valid() const { return !deadlock && problems.empty(); }
    std::string describe_problems() const;  // deadlock and problems, one per line
};

// The static checks, without timing: every (microbatch, chunk) forwarded and backwarded once
// on its stage, forward before backward; each forward of a chunk other than global chunk 0
// preceded by its recv_act and each chunk's output sent on by a send_act after its forward
// (except the last global chunk's); likewise recv_grad before and send_grad after each
// backward; and every send matched by exactly one receive on the destination stage and vice
// versa. Chunks are where `placement` puts them. Returns the problems found, empty when there
// are none.
std::vector<std::string> check_streams(const std::vector<std::vector<Instr>>& streams, int v, int m,
                                       model::Placement placement = model::Placement::round_robin);

// Replays the streams (one per stage, P = streams.size()) with v chunks per stage, placed by
// `placement`, and m microbatches. Never throws for a broken stream: the result says what is
// wrong.
Simulation simulate(const std::vector<std::vector<Instr>>& streams, int v, int m,
                    const Costs& costs = {},
                    model::Placement placement = model::Placement::round_robin);

// The streams schedule(kind, P, v, m, stage) for every stage, replayed. Throws trident::Error
// for invalid arguments, as schedule() does.
Simulation simulate(Kind kind, int P, int v, int m, const Costs& costs = {});

// Throws trident::Error with describe_problems() unless the simulation is valid.
void require_valid(const Simulation& sim);

}  // namespace trident::pipeline
