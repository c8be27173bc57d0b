// What each rank of the grid holds in memory during training, computed from the config alone:
// the buffers Trident allocates, counted the way it allocates them (model/gpt.cpp,
// optim/adamw.cpp, pipeline/executor.cpp), so a CPU run's measured figures (the metrics'
// mem_*_bytes) can be held against the plan. Ranks of one pipeline stage hold the same
// figures (tensor-parallel slices and data-parallel replicas are equal in size), so the plan
// is per stage.
//
// Model states (ZeRO, arXiv 1910.02054, §5): the stage's flat parameter buffer (its layout's
// total, padded to a multiple of D) of weights and of gradients, and 12 bytes per parameter
// of optimizer state (fp32 master weights, Adam's m and v). ZeRO stage 1 shards the optimizer
// state over the D replicas, stage 2 also the gradients, stage 3 also the weights. Under
// low-rank adapters (training.lora) the model's weights are frozen (no gradients, no state:
// whole at stages 0 to 2, a D-th at 3) and the adapters' buffer has all three, sharded alike.
//
// Activations, in Korthikanti et al.'s terms (arXiv 2205.05198; s sequence, b micro batch,
// h hidden, a heads, t tensor-parallel size, 16-bit elements). Per layer Trident keeps the
// ln1 output, qkv, the attention probabilities, the attention output, resid2, the ln2
// output, fc1's output, the GELU output and the layer's output (and LayerNorm's mean and
// rstd, fp32): 32·s·b·h + 2·a·s²·b bytes without parallelism. That is Korthikanti's
// 34·s·b·h + 5·a·s²·b less the dropout masks and the post-dropout copies, which Trident
// regenerates from a counter-based hash instead of storing. Tensor parallelism splits qkv,
// the probabilities, the attention output, fc1 and GELU: s·b·h·(8 + 24/t) + 2·a·s²·b/t.
// Sequence parallelism splits the rest by rows but keeps the all-gathered LayerNorm outputs
// that the column-parallel GEMMs read: s·b·h·(4 + 32/t) + 2·a·s²·b/t. Selective recompute
// drops the probabilities (the a·s² term); full recompute keeps only each layer's output,
// 2·s·b·h (2·s·b·h/t with sequence parallelism), and both rebuild into one scratch layer
// shared by all microbatches (a temporary buffer here). A chunk's set adds its input, the
// token ids (int32) on the first stage, and the final LayerNorm, logits (padded vocabulary
// over t) and fp32 loss statistics on the last. A stage holds as many sets per chunk as its
// schedule has that chunk's microbatches in flight at most (1F1B: min(m, P − stage), GPipe:
// m, interleaved and zero-bubble: counted from the schedule's own instruction stream, a
// split backward's set held until its W), and a split backward's sets also hold the
// gradients B keeps for W.
//
// Offload (optimizer.offload: nvme, optim/offload_store.h): the 12 bytes per owned parameter
// move to files; the device keeps one chunk of them, 12·min(owned, offload_chunk) bytes.
// optimizer.offload_params moves ZeRO-3's weight shard there too (data_parallel/param_file.h):
// the device keeps the gathered units (below) and a unit's part of staging for each.
// optimizer.offload: host (optim/host_store.h): they move to host memory, and the device
// keeps none (the update runs on the host).
//
// Context parallelism over C ranks: every microbatch buffer holds T/C tokens of each sequence;
// what attention keeps is Ulysses' (B, a/(t·C), s, s) or ring attention's fp32 log-sum-exp
// (B, a/t, s/C), which selective recompute keeps too; the model states are padded and ZeRO
// sharded over the D·C ranks holding the same weights; the temporary buffers add the ring's
// or the all-to-alls' exchange buffers and the tokens' positions.
//
// ZeRO-3's gathered parameters (src/data_parallel/zero_units.h) besides the shards: resharded
// after every use, the two largest units of the stage (one in use, the next prefetched under
// it; the LM head's ln_f and tied wte are two in use), and with a tied embedding on a single
// stage its unit as well, held from the embedding to the LM head; kept through the step
// (parallel.reshard_after_forward false), the stage's whole flat buffer of weights.
//
// Temporary buffers: the backward scratch the model allocates once (gradients of the
// residual stream, of the MLP and of attention, the (b, a/t, s, s) attention gradient), the
// recompute scratch, and the pipeline executor's message buffers (those received and not
// yet computed on, as the schedule walks, and its fixed pool of outgoing ones: a bound that
// does not grow with the microbatches).
#pragma once

#include <cstdint>
#include <vector>

#include "config/config.h"
#include "model/param_layout.h"

namespace trident::plan {

// Bytes per element of each kind of state, by training.precision.
int weight_bytes(kernels::DType precision);
int gradient_bytes(kernels::DType precision, bool fp32_grad_accumulation);
int activation_bytes(kernels::DType precision);
// fp32 master weights, Adam's m and v: per parameter, before ZeRO sharding.
constexpr int kOptimizerBytes = 12;

// What a plan is computed from: the config, and what it does not say itself.
struct PlanInputs {
    config::Config cfg;
    int weight_bytes = 4;      // per parameter
    int grad_bytes = 4;        // per parameter
    int activation_bytes = 4;  // per activation element (fp32 statistics and token ids: 4)
    int zero_stage = 1;        // 0 .. 3
    // Optimizer state per parameter of a layer's weight matrices and of the rest: the master
    // weights and the arrays the config's optimizer keeps for each (optim::state_bytes:
    // AdamW 12 and 12, Muon 8 and 12; under optimizer.offload every array for every parameter:
    // Muon 16 and 16, GaLore 12 and 12).
    int matrix_optimizer_bytes = kOptimizerBytes, optimizer_bytes = kOptimizerBytes;
    // FLOPs of the optimizer's whole-matrix steps in one update, each layer matrix once
    // (optim::Optimizer::matrix_step_flops: Muon's Newton-Schulz iterations); 0 for AdamW.
    double matrix_step_flops = 0;
    // The passes an update makes over the state under optimizer.offload (optim::state_passes:
    // 1 and 1; Muon 2 and 2; GaLore 2 and 1).
    int offload_reads = 1, offload_writes = 1;
    // Under data.documents: mask, the documents' mean length (trident plan --doc-len): the
    // attention computes within them, L/S of a causal window's scores; 0: one per window.
    int doc_len = 0;
    // The fraction of a causal window's attention scores computed: min(1, doc_len / seq_len).
    double attended() const;
};

// The inputs for `cfg` as it stands: its precision's element sizes and its ZeRO stage.
PlanInputs plan_inputs(const config::Config& cfg, int grad_bytes);

// Bytes of model state held by one of D data-parallel replicas of `parameters` parameters.
struct ModelStates {
    double weights = 0, gradients = 0, optimizer = 0;
    double total() const { return weights + gradients + optimizer; }
};
// The optimizer state's bytes per parameter: `per_parameter` each, but `per_matrix_parameter`
// for the `matrices` of them in layer weight matrices (PlanInputs); and `owned`, the state an
// optimizer keeps per whole matrix (GaLore's, optim::Optimizer::matrix_states) that rank 0 of
// a stage holds as the owner of matrices 0, S·M, 2·S·M, ... (optim/matrix_exchange.h), not
// sharded further.
struct OptimizerBytes {
    int per_parameter = kOptimizerBytes;
    double matrices = 0;
    int per_matrix_parameter = kOptimizerBytes;
    double owned = 0;
    double of(double parameters) const {
        return parameters * per_parameter + matrices * (per_matrix_parameter - per_parameter);
    }
};
ModelStates model_states(double parameters, int data_parallel, int zero_stage, int weight_bytes,
                         int grad_bytes, const OptimizerBytes& optimizer = {});
// The optimizer state's bytes of `layout`'s parameters, its layer matrices counted (the bytes
// from `in`), and the per-matrix state its rank 0 owns (over S·M owners: the shard group's
// parallel.shard_ranks() and `tensors`, the layout's tensor ranks).
OptimizerBytes optimizer_bytes(const PlanInputs& in, const model::ParamLayout& layout);

// The figures of every rank of one pipeline stage, in bytes.
struct StageMemory {
    int stage = 0;
    int64_t parameters = 0;  // held: the flat buffer's elements, padding included
    ModelStates states;
    double activations = 0;   // the activation sets the schedule keeps in flight at most
    int activation_sets = 0;  // how many: (microbatch, chunk) pairs
    double korthikanti = 0;   // the same sets by Korthikanti et al.'s per-layer formula
    // backward and recompute scratch, pipeline messages, a matrix optimizer's scratch
    double temporary = 0;
    double gathered = 0;  // ZeRO-3's units of weights gathered at once, at most
    // optimizer.offload: nvme: the optimizer state in files (not counted in the total),
    // states.optimizer then being the device buffer of one chunk the update streams through;
    // host: in host memory (not counted either), states.optimizer then 0; with
    // optimizer.offload_params the weight shard too (states.weights then 0).
    double offloaded = 0;
    double total() const { return states.total() + activations + temporary + gathered; }
};

std::vector<StageMemory> plan_memory(const PlanInputs& in);

// plan_memory's parts, stage by stage (the search, src/plan/search.h, puts them together for
// many layouts at once). The layout of a stage's parameters on tensor rank 0, its units
// aligned as ZeRO shards them:
model::ParamLayout stage_layout(const PlanInputs& in, int stage);
// the stage's model states (parameters, weights, gradients, optimizer state; gathered and
// offloaded), activations and temporaries left zero;
StageMemory stage_states(const PlanInputs& in, const model::ParamLayout& layout);
// and its buffers: bytes of one activation set of each local chunk, the temporaries but the
// pipeline's messages, and one message's bytes.
struct StageBuffers {
    std::vector<double> set_bytes;
    double temporary = 0;
    double message = 0;
};
StageBuffers stage_buffers(const PlanInputs& in, const model::ParamLayout& layout);

// Korthikanti et al.'s activation bytes per layer and microbatch (16-bit elements, dropout
// masks included), for this config's parallelism and recompute.
double korthikanti_layer_bytes(const config::Config& cfg);

}  // namespace trident::plan
