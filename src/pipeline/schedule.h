// Pipeline schedules as data: for one stage, the ordered list of instructions it executes in
// one training step (docs/ARCHITECTURE.md, "Schedules"; DeepSpeed's pipeline engine has the
// same idea). The executor
// only walks the list; the simulator replays every stage's list together.
//
// Layers are cut into P·v chunks (v = 1 except for the interleaved schedule and ZB-V); where
// global chunk g lives is the schedule's placement (model::ChunkMap): round robin, on stage
// g mod P as its local chunk g / P; ZB-V's V shape, chunks r and 2P - 1 - r on stage r.
// Global chunk 0 starts with the embedding, global chunk P·v - 1 ends with the LM head and
// the loss.
//
// Semantics the executor and the simulator share:
//   forward(mb, c)    run local chunk c forward on microbatch mb; its input is the
//                     embedding (global chunk 0) or the activation received by recv_act
//   backward(mb, c)   run chunk c backward; its output gradient comes from the loss (last
//                     global chunk) or from recv_grad; frees mb's activations of chunk c
//   backward_input(mb, c)   the part of backward that computes the gradient of the
//                     chunk's input (B: on the pipeline's critical path); keeps what the
//                     weight gradients need
//   backward_weight(mb, c)  the rest: the gradients of the chunk's parameters (W: they can
//                     wait); frees mb's activations of chunk c. B then W is backward.
//   send_act(mb, c)   send chunk c's output activation to the stage holding global chunk
//                     g + 1 (round robin the next stage, from the last stage stage 0; it
//                     may be this stage itself, as in the V's turn on stage P - 1)
//   recv_act(mb, c)   receive chunk c's input activation from the stage holding g - 1
//   send_grad(mb, c)  send the gradient of chunk c's input to the stage holding g - 1
//   recv_grad(mb, c)  receive the gradient of chunk c's output from the stage holding g + 1
// Sends do not wait for their receive (buffered, as MPI_Isend); a receive waits for its
// send. A schedule is valid when, replayed under these rules, every stage finishes.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "model/param_layout.h"

namespace trident::pipeline {

enum class Kind { gpipe, one_f_one_b, interleaved, zb_h1, zb_h2, zb_v };

enum class Op {
    forward,
    backward,
    backward_input,
    backward_weight,
    send_act,
    recv_act,
    send_grad,
    recv_grad
};

struct Instr {
    Op op;
    int microbatch;
    int chunk;  // local chunk index on this stage, 0 .. v-1

    bool operator==(const Instr&) const = default;
};

// The instruction stream of `stage` (0 .. P-1) for one step of m microbatches with v chunks
// per stage. GPipe: every forward, then every backward. 1F1B (PipeDream-Flush): P - stage - 1
// warm-up forwards, then one forward / one backward, then the cool-down backwards.
// Interleaved 1F1B: Megatron's order over v chunks; m must be a multiple of P.
// Zero-bubble (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): the backward split
// into B and W, the W's placed to fill what would be idle time. ZB-H1 keeps at most P
// microbatches' activations on any stage (1F1B's peak, held by its first stage) and leaves
// a bubble of about a third of 1F1B's; ZB-H2 allows 2P - 1 and runs more forwards early.
// ZB-V (Qi et al., "Pipeline Parallelism with Controllable Memory", 2024): two chunks per
// stage placed in a V (model::ChunkMap), at most 2P chunks' activations on any stage (1F1B's
// peak: P microbatches of a stage's layers), its bubble the start-up of the V's first leg.
// The three orders come from replaying the pipeline with unit costs (F = B = W) and a
// rule, on each stage: a B or an F whichever is ready (alternating when both are; an F only
// under the stage's limit of activations; of two chunks' F the later chunk's, of two B's the
// earlier's), else the oldest pending W.
// Throws trident::Error for invalid arguments (P, m < 1; v != 1 for all but interleaved and
// ZB-V; v < 2 or m not a multiple of P for interleaved; v != 2 or P < 2 for ZB-V).
std::vector<Instr> schedule(Kind kind, int P, int v, int m, int stage);
// The streams of every stage, 0 .. P-1 (the zero-bubble orders replayed once for all).
std::vector<std::vector<Instr>> schedules(Kind kind, int P, int v, int m);

const char* to_string(Op op);
// The config's names: gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v.
const char* to_string(Kind kind);

// The inverse of to_string(Kind); throws trident::Error naming the accepted names.
Kind parse_kind(std::string_view name);

// Where a schedule places the chunks: ZB-V in a V, the others round robin.
inline model::Placement placement(Kind kind) {
    return kind == Kind::zb_v ? model::Placement::v_shape : model::Placement::round_robin;
}
inline model::ChunkMap chunk_map(Kind kind, int P, int v) {
    return {placement(kind), P, v};
}

// Forwards a stage runs before its first backward (1F1B's and interleaved's warm-up; GPipe: m).
// Interleaved counts virtual microbatches (one chunk of one microbatch each).
int warmup_forwards(Kind kind, int P, int v, int m, int stage);

// The bubble fraction, idle time over ideal compute time, with a forward, a B and a W of
// equal cost: PTD-P's (P - 1)/m for GPipe and 1F1B and (P - 1)/(v·m) for interleaved;
// Qi et al.'s (P - 1)(F + B - W) over m(F + B + W) for the zero-bubble schedules, (P - 1)/(3m)
// (ZB-H2's further gain needs consecutive steps to overlap, which a step that ends with the
// global gradient norm's synchronisation rules out: within one step the last stage's
// (P - 1)·F start bounds them both).
double bubble_formula(Kind kind, int P, int v, int m);
// Whether a schedule splits the backward into B and W.
bool splits_backward(Kind kind);

}  // namespace trident::pipeline
