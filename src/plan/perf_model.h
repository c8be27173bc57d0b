// A step-time model of a training run on given hardware: compute from the GEMM FLOPs and the
// memory traffic of everything else, plus the communication on the critical path, the
// pipeline bubble and the optimizer. What it assumes:
// - GEMMs run at the achieved GEMM rate. FLOPs are those executed: Megatron's count per layer
//   (causal attention at half, as kernels that skip the masked blocks do), backward twice the
//   forward, plus what recompute reruns (full: a layer's forward up to its GELU; selective:
//   the attention scores).
// - Every other op (LayerNorm, softmax, GELU, bias, dropout, residual adds, the loss, the
//   zeroing of gradient scratch) reads its inputs and writes its outputs once at the
//   achieved memory bandwidth: Trident's fused ops, with dropout masks regenerated, not read.
// - Collectives use ring algorithms: an all-reduce sends 2(n−1)/n of its buffer, a
//   reduce-scatter or all-gather (n−1)/n of the whole vector, at the bandwidth of the slowest
//   link, plus a fixed latency per call. A group that spans nodes reduces hierarchically:
//   inside each node over NVLink, then across nodes, where each GPU has its share of the
//   node's network adapters (the per-GPU inter-node bandwidth) and a group with k members in
//   a node uses k such shares. Payloads are the activation or gradient precision (16-bit
//   for bf16/fp16).
// - Tensor-parallel collectives are on the critical path: none overlaps compute, but with
//   parallel.tp_overlap a split linear's, cut into M ring steps under its GEMM's pieces,
//   exposes a collective's M-th plus one latency per further step (docs/FORMULAS.md).
// - Context-parallel exchanges are on the critical path as well: ring attention's blocks of
//   keys and values (and their gradients) as sends between neighbours, Ulysses' all-to-alls
//   as collectives, none overlapping the attention's compute.
// - Expert parallelism's all-to-alls (the rows to their experts' ranks and back) are on the
//   critical path too, none overlapping the experts' or the attention's compute.
// - Pipeline sends are on the critical path too, once per chunk per microbatch each way; the
//   bubble is PTD-P's, (P − 1)/(v·m) of the ideal time, taken on the slowest stage.
// - The data-parallel communication does what the runtime does (optim/adamw.h): the
//   reduction (zero_stage 0's all-reduce, 1's reduce-scatter) runs in buckets of
//   parallel.bucket_size under the last microbatch's backward (parallel.overlap_grad_reduce)
//   and only what that does not cover, at least its last bucket, is exposed; zero_stage 1's
//   all-gather of the updated parameters runs under the next step's first forward
//   (parallel.overlap_param_gather), exposing at least its first bucket; without them it
//   follows the last backward. The overlap is taken to cost the compute nothing. With hybrid
//   sharding, the sums across the shard groups follow the reduction, exposed.
// - The optimizer reads and writes the fp32 master weights and Adam's moments, reads the
//   gradients three times (norm, clipping, update) and writes the weights, at the memory
//   bandwidth, for the parameters the rank owns. With optimizer.offload: nvme the state is
//   also read from and written to its file, 12 bytes per owned parameter each way, at the
//   disk bandwidth, under the update (read-ahead, write-behind): the longer of the two. The
//   step is I/O-bound when that file traffic takes longer than the step's compute. With
//   optimizer.offload: host the update runs on the host at its memory bandwidth (master
//   weights and moments read and written, the fp32 gradients read, the weights written) after
//   the owned gradients come down and before the weights go up over the host link (one after
//   the other, a chunk at a time, as built: not overlapped).
// Ranks are placed in Megatron's grid order (tensor fastest, then context, data, pipeline) on
// nodes of gpus_per_node GPUs.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "plan/communication.h"
#include "plan/memory_model.h"
#include "plan/stage_shape.h"

namespace trident::plan {

struct Hardware {
    std::string name;             // a preset's name, or "custom"
    double gemm_flops = 0;        // FLOP/s the GEMMs achieve
    double memory_bandwidth = 0;  // bytes/s achieved by memory-bound ops
    double intra_bandwidth = 0;   // bytes/s per GPU, one direction, inside a node
    double inter_bandwidth = 0;   // bytes/s per GPU, one direction, between nodes
    int gpus_per_node = 8;
    double latency = 0;  // s per collective call or message
    // bytes/s between a rank and its optimizer.offload_dir, its reads and writes together:
    // one NVMe drive per rank (about 2 GB/s) unless given (trident plan --disk-bw), for
    // every preset.
    double disk_bandwidth = 2e9;
    // optimizer.offload: host: bytes/s each way between a GPU and host memory (assumed: PCIe
    // 4.0 x16's achieved 25 GB/s) and of the host's own memory-bound update (assumed: 100 GB/s,
    // a server's DRAM), for every preset.
    double host_link_bandwidth = 25e9;
    double host_memory_bandwidth = 100e9;
    // A preset's GPU: its datasheet's dense 16-bit FLOP/s (MFU is against it) and its memory
    // in bytes; 0 where the figures were given one by one.
    double peak_flops = 0;
    double memory_bytes = 0;
};

// dgx2h-v100, dgx-a100, dgx-h100 (their figures and sources in perf_model.cpp). Throws
// trident::Error naming the presets for any other name.
Hardware hardware_preset(std::string_view name);
std::vector<std::string> hardware_presets();

// Seconds of one step, and what they are spent on (on the slowest stage).
struct StepTime {
    double step = 0;
    double compute = 0;        // GEMMs and memory-bound ops of every microbatch
    double tensor_comm = 0;    // tensor-parallel collectives
    double context_comm = 0;   // context-parallel exchanges (ring sends or Ulysses' all-to-alls)
    double expert_comm = 0;    // expert parallelism's all-to-alls
    double pipeline_comm = 0;  // sends between stages
    double bubble = 0;         // pipeline fill and drain
    double data_comm = 0;      // the data-parallel reduction, as far as it is exposed
    double optimizer = 0;      // with optimizer.offload: nvme, at least offload_io
    // The state's file read and written (optimizer.offload: nvme) and the parameter shard's
    // (optimizer.offload_params); the gradients down and the weights up between device and
    // host (host).
    double offload_io = 0;
    int slowest_stage = 0;
    double executed_flops = 0;  // per step on that stage's ranks, recompute included
};

StepTime predict_step(const PlanInputs& in, const Hardware& hw);

// Zero-bubble schedules' bubbles as simulated, by schedule, P, v, m and a microbatch's forward,
// backward and W on the slowest stage: the layouts the search models share many.
using BubbleCache = std::map<std::tuple<int, int, int, int, double, double, double>, double>;
// The same with the stages' memory planned already (only their parameters are read), the
// bubbles looked up in `bubbles` first.
StepTime predict_step(const PlanInputs& in, const Hardware& hw,
                      const std::vector<StageMemory>& memory, BubbleCache& bubbles);

// Seconds of one microbatch through a chunk of a stage, its compute alone (GEMMs and
// memory-bound ops): forward and backward apart (the backward, recompute included, is what a
// data-parallel reduction can hide under).
struct ChunkSeconds {
    double forward = 0, backward = 0;
    double weight = 0;  // of the backward, the weight gradients' GEMMs (a split backward's W)
    double flops = 0;   // executed
};
ChunkSeconds chunk_seconds(const PlanInputs& in, const ChunkShape& chunk, const Hardware& hw);

// A lower bound on predict_step(in, hw).step, for the search (search.h), from each stage's
// compute of a microbatch (`compute`: its chunks' chunk_seconds, forward and backward summed)
// and its parameters (`parameters`, StageMemory's). What it counts, each part at most what the
// model charges: m microbatches of the slowest stage's compute and, at ZeRO 2 and 3, of its
// exchanges of every microbatch (each unit reduce-scattered and, resharded, gathered once, the
// units together in one call: a call's time is its latency plus a share of its bytes); and
// the bubble: PTD-P's (P − 1)/v microbatches more, or for the zero-bubble schedules the
// forwards the last stage waits for before its first, (P − 1)/v of a microbatch's forward
// share (with latency 0, as simulated, no stage can start sooner nor compute for less). The
// rest of the step is at least none. Of `in` it reads the grid, the schedule, the ZeRO
// settings, the element sizes and the microbatches. Low-rank adapters' exchanges are not
// counted (their buffer is not the units'). With `exchanges` (each stage's, from
// microbatch_exchange_seconds) those too.
double step_lower_bound(const PlanInputs& in, const Hardware& hw,
                        const std::vector<ChunkSeconds>& compute,
                        const std::vector<double>& parameters,
                        const std::vector<double>& exchanges = {});
// Of each stage's microbatch, the exchanges predict_step charges that ZeRO's sharding does not
// change (tensor, context, pipeline; `traffic` planned at ZeRO stage 0 or 1, where no key/value
// replica sums a microbatch's gradients).
std::vector<double> microbatch_exchange_seconds(const PlanInputs& in, const Hardware& hw,
                                                const std::vector<StageTraffic>& traffic);

}  // namespace trident::plan
