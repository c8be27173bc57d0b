// Pipeline schedules as data: for one stage, the ordered list of instructions it executes in
// one training step (docs/ARCHITECTURE.md, "Schedules"; DeepSpeed's pipeline engine has the
// same idea). The executor
// only walks the list; the simulator replays every stage's list together.
//
// Layers are cut into P·v chunks of equal size; chunk g (global) lives on stage g mod P as
// its local chunk g / P (v = 1 except for the interleaved schedule). Global chunk 0 starts
// with the embedding, global chunk P·v - 1 ends with the LM head and the loss.
//
// Semantics the executor and the simulator share:
//   forward(mb, c)    run local chunk c forward on microbatch mb; its input is the
//                     embedding (global chunk 0) or the activation received by recv_act
//   backward(mb, c)   run chunk c backward; its output gradient comes from the loss (last
//                     global chunk) or from recv_grad; frees mb's activations of chunk c
//   send_act(mb, c)   send chunk c's output activation to the stage holding global chunk
//                     g + 1 (the next stage; from the last stage, stage 0)
//   recv_act(mb, c)   receive chunk c's input activation from the stage holding g - 1
//   send_grad(mb, c)  send the gradient of chunk c's input to the stage holding g - 1
//   recv_grad(mb, c)  receive the gradient of chunk c's output from the stage holding g + 1
// Sends do not wait for their receive (buffered, as MPI_Isend); a receive waits for its
// send. A schedule is valid when, replayed under these rules, every stage finishes.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace trident::pipeline {

enum class Kind { gpipe, one_f_one_b, interleaved };

enum class Op { forward, backward, send_act, recv_act, send_grad, recv_grad };

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
// Throws trident::Error for invalid arguments (P, m < 1; v != 1 for gpipe and 1f1b; v < 2 or
// m not a multiple of P for interleaved).
std::vector<Instr> schedule(Kind kind, int P, int v, int m, int stage);

const char* to_string(Op op);
const char* to_string(Kind kind);  // the config's names: gpipe, 1f1b, interleaved

// The inverse of to_string(Kind); throws trident::Error naming the accepted names.
Kind parse_kind(std::string_view name);

// Where chunks live: global chunk g is local chunk g / P of stage g mod P.
inline int global_chunk(int P, int stage, int chunk) {
    return chunk * P + stage;
}

// Forwards a stage runs before its first backward (1F1B's and interleaved's warm-up; GPipe: m).
// Interleaved counts virtual microbatches (one chunk of one microbatch each).
int warmup_forwards(Kind kind, int P, int v, int m, int stage);

// PTD-P's bubble fraction, idle time over ideal compute time: (P - 1)/m for GPipe and 1F1B,
// (P - 1)/(v·m) for interleaved.
double bubble_formula(Kind kind, int P, int v, int m);

}  // namespace trident::pipeline
