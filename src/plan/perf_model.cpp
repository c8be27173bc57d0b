// The step-time model (see perf_model.h).
#include "plan/perf_model.h"

#include <algorithm>
#include <optional>

#include "config/model_shape.h"
#include "kernels/error.h"
#include "model/flops.h"
#include "pipeline/simulator.h"
#include "plan/stage_shape.h"

namespace trident::plan {

namespace {

using parallel::CommKind;

}  // namespace

ChunkSeconds chunk_seconds(const PlanInputs& in, const ChunkShape& chunk, const Hardware& hw) {
    using config::Recompute;
    const config::Config& cfg = in.cfg;
    const model::Dims d = config::rank_dims(cfg);
    const double N = d.N, H = d.H, Hm = d.Hm, Fm = d.Fm;
    const double RC = static_cast<double>(d.R) * H, NC = N * H, NCm = N * Hm, NFm = N * Fm;
    // Attention scores of a microbatch on this rank: its queries against the whole
    // sequence's keys, (B, NH/M, T, seq_len).
    const double S = static_cast<double>(d.B) * d.heads * d.T * d.seq_len * in.attended();
    const double drop = cfg.model.dropout > 0 ? 1 : 0;
    const Recompute recompute = cfg.training.recompute;

    const model::GemmFlops flops = model::gemm_flops(model::resolve_spec(config::gpt_shape(cfg)), d,
                                                     recompute, 0, in.attended());
    // Memory-bound elements of one layer: LayerNorms, bias adds, dropout, residual adds (on
    // the rank's rows), softmax (read scores, write and reread the probabilities), GELU, and
    // backward's reads of what forward kept, its writes of gradients and zeroed scratch.
    const double mem_forward = RC * (14 + 4 * drop) + 4 * S + 4 * NCm + 2 * NFm;
    const double mem_backward = RC * (10 + 6 * drop) + 2 * NC + 6 * NFm + 14 * NCm + 4 * S;
    // Full recompute reruns the forward up to the GELU; selective, the scores and softmax.
    double rerun_mem = 0;
    if (recompute == Recompute::full)
        rerun_mem = RC * (9 + 2 * drop) + 4 * S + 4 * NCm + 2 * NFm;
    else if (recompute == Recompute::selective)
        rerun_mem = 3 * S + 2 * NCm;

    double forward_flops = chunk.layers * flops.layer_forward;
    double backward_flops = chunk.layers * flops.layer_backward;
    double weight_flops = chunk.layers * flops.layer_weight;
    double forward_mem = chunk.layers * mem_forward;
    double backward_mem = chunk.layers * (mem_backward + rerun_mem);
    if (chunk.embeds) {  // look up rows of wte and wpe; scatter their gradients back
        forward_mem += 3 * NC;
        backward_mem += 3 * NC;
    }
    if (chunk.head) {  // final LayerNorm, logits (N, Vp/M), cross-entropy in place
        const double logits = N * static_cast<double>(d.Vm);
        forward_flops += flops.head_forward;
        backward_flops += flops.head_backward;
        weight_flops += flops.head_weight;
        forward_mem += 2 * RC + logits;
        backward_mem += 4 * RC + NC + 2 * logits;
    }
    const double bytes = in.activation_bytes;
    ChunkSeconds s;
    s.forward = forward_flops / hw.gemm_flops + forward_mem * bytes / hw.memory_bandwidth;
    s.backward = backward_flops / hw.gemm_flops + backward_mem * bytes / hw.memory_bandwidth;
    s.weight = weight_flops / hw.gemm_flops;
    s.flops = forward_flops + backward_flops;
    return s;
}

namespace {

double fraction_sent(CommKind kind, int ranks) {
    const double n = ranks;
    return kind == CommKind::all_reduce ? 2 * (n - 1) / n : (n - 1) / n;
}

// Seconds of one collective of `payload` bytes (as Comm counts it) over n ranks, `per_node`
// of them in each node: hierarchical, inside the nodes then across them.
double collective_seconds(CommKind kind, double payload, int n, int per_node, const Hardware& hw) {
    if (n <= 1) return 0;
    const double vector = kind == CommKind::all_gather ? payload * n : payload;
    const int k = std::clamp(per_node, 1, n);
    const int nodes = n / k;
    double t = hw.latency;
    if (k > 1) t += fraction_sent(kind, k) * vector / hw.intra_bandwidth;
    // Across nodes each member carries a k-th of the vector through its own adapter share.
    if (nodes > 1) t += fraction_sent(kind, nodes) * vector / k / hw.inter_bandwidth;
    return t;
}

// The exposed seconds of a collective of `seconds` run as a ring of `pieces` steps under a
// GEMM's pieces (parallel.tp_overlap): the first or last piece's transfer, which nothing
// hides, and a message latency for each further step (docs/FORMULAS.md).
double exposed(double seconds, int pieces, const Hardware& hw) {
    return pieces <= 1 ? seconds : seconds / pieces + (pieces - 1) * hw.latency;
}

// Seconds of a group's calls: those made per microbatch (divided by m) or once per step;
// with `only`, just the calls of that kind.
double group_seconds(const GroupTraffic& g, bool per_microbatch, int64_t m, int per_node,
                     bool link_inside_node, const Hardware& hw,
                     std::optional<CommKind> only = std::nullopt) {
    double t = 0;
    for (const Calls& c : g.calls) {
        if (c.per_microbatch != per_microbatch || (only && c.kind != *only)) continue;
        const double payload = c.elements * c.element_bytes;
        const double one = c.kind == CommKind::send
                               ? hw.latency + payload / (link_inside_node ? hw.intra_bandwidth
                                                                          : hw.inter_bandwidth)
                               : collective_seconds(c.kind, payload, g.size, per_node, hw);
        t += static_cast<double>(c.calls) * exposed(one, c.pieces, hw);
    }
    return per_microbatch ? t / static_cast<double>(m) : t;
}

// Figures per GPU. GEMM rates are what cuBLAS reaches on large 16-bit GEMMs (for the V100 an
// assumption: 77% of peak), memory bandwidths 90% of the HBM's; NVLink one direction;
// inter-node bandwidth the node's InfiniBand adapters shared by its GPUs.
Hardware preset(const char* name, double gemm, double memory, double intra, double inter,
                int per_node, double peak, double gib) {
    Hardware hw{name, gemm, memory, intra, inter, per_node, 20e-6};
    hw.peak_flops = peak;
    hw.memory_bytes = gib * 0x1p30;
    return hw;
}

const std::vector<Hardware>& presets() {
    static const std::vector<Hardware> all = {
        // DGX-2H (Megatron-LM 2019): 16 V100 SXM3 32GB, 130 TFLOP/s fp16 peak (the paper's 39
        // TFLOP/s is 30% of it), 900 GB/s HBM2; NVSwitch 300 GB/s per GPU both ways;
        // 8×100 Gb/s EDR.
        preset("dgx2h-v100", 100e12, 810e9, 150e9, 100e9 / 16, 16, 130e12, 32),
        // DGX A100: 8 A100-80GB, 312 TFLOP/s bf16, 2039 GB/s; NVLink 3 600 GB/s; 8×200 Gb/s HDR.
        preset("dgx-a100", 280e12, 1830e9, 300e9, 200e9 / 8, 8, 312e12, 80),
        // DGX H100: 8 H100 SXM 80GB, 989 TFLOP/s bf16 (cuBLAS 8192³: about 798), 3350 GB/s;
        // NVLink 4 900 GB/s; 8×400 Gb/s NDR.
        preset("dgx-h100", 798e12, 3000e9, 450e9, 400e9 / 8, 8, 989e12, 80),
    };
    return all;
}

// Where a stage's groups sit on nodes of gpus_per_node GPUs. Grid order rank =
// tp + M·(cp + C·(dp + D·pp)): tensor ranks are neighbours, context ranks M apart, the
// data-context group's members M apart too (its shard groups runs of N of them), the shard
// groups' replicas M·N apart, stages M·C·D apart; an expert group is E consecutive members
// of the data-context group, M apart.
struct Placement {
    int tensor_per_node = 1;
    int context_per_node = 1;
    bool context_in_one_node = false;
    int data_per_node = 1;     // of a shard group (all D·C ranks without hybrid sharding)
    int replica_per_node = 1;  // of hybrid sharding's replica group
    int expert_per_node = 1;
    int expert_shard_per_node = 1;  // ranks E apart in a shard group
    bool expert_in_one_node = false;
    bool grid_in_one_node = false;
};

Placement placement(const config::ParallelConfig& p, int g) {
    const int N = p.shard_ranks(), replicas = p.data * p.context / N;
    Placement at;
    at.tensor_per_node = std::min(p.tensor, g);
    at.context_per_node = p.tensor >= g ? 1 : std::min(p.context, g / p.tensor);
    at.context_in_one_node = p.tensor * p.context <= g;
    at.data_per_node = p.tensor >= g ? 1 : std::min(N, g / p.tensor);
    at.replica_per_node = p.tensor * N >= g ? 1 : std::min(replicas, g / (p.tensor * N));
    at.expert_per_node = p.tensor >= g ? 1 : std::min(p.expert, g / p.tensor);
    at.expert_shard_per_node =
        p.tensor * p.expert >= g ? 1 : std::min(N / p.expert, g / (p.tensor * p.expert));
    at.expert_in_one_node = p.tensor * p.expert <= g;
    at.grid_in_one_node = p.pipeline * p.tensor * p.context * p.data <= g;
    return at;
}

// Seconds of one pipeline stage's ranks.
struct StageSeconds {
    double compute = 0, tensor = 0, context = 0, expert = 0, pipeline = 0;  // per microbatch
    double data_gathers = 0;                                                // per microbatch
    double forward = 0, backward = 0, weight = 0, flops = 0;                // of one microbatch
    double tensor_step = 0, embedding = 0, data = 0, optimizer = 0;         // per step
    double offload_io = 0;                                                  // per step
    double microbatch() const {
        return compute + tensor + context + expert + pipeline + data_gathers;
    }
    double after_flush() const { return tensor_step + embedding + data + optimizer; }
};

// The data-parallel calls made once per step, less what overlaps the backward before them
// (the reduction) and the next forward (zero_stage 1's gather); `st` has its forward and
// backward already.
double data_step_seconds(const PlanInputs& in, const GroupTraffic& data, const StageSeconds& st,
                         double params, int data_per_node, const Hardware& hw) {
    const auto& p = in.cfg.parallel;
    const int64_t m = in.cfg.derived.grad_accum_steps;
    const auto data_seconds = [&](std::optional<CommKind> only) {
        return group_seconds(data, false, m, data_per_node, true, hw, only);
    };
    double seconds = data_seconds(std::nullopt);
    if (in.zero_stage <= 1 && p.data > 1) {
        // Each bucket of parallel.bucket_size is one call of its share of the time.
        const double bucket = std::min(1.0, static_cast<double>(p.bucket_size) / params);
        // (Stage 0's all-reduces include the step's loss, one scalar: no matter.)
        const double reduce =
            data_seconds(in.zero_stage == 0 ? CommKind::all_reduce : CommKind::reduce_scatter);
        const double gather = in.zero_stage == 1 ? data_seconds(CommKind::all_gather) : 0.0;
        // Reduced as the last backward completes the buckets: the last one waits for
        // its end. Gathered under the next forward: the first one is waited for at once.
        if (p.overlap_grad_reduce)
            seconds -= reduce - std::max(reduce - st.backward, reduce * bucket);
        if (p.overlap_param_gather)
            seconds -= gather - std::max(gather - st.forward, gather * bucket);
    }
    return seconds;
}

// A stage's exchanges of every microbatch but the data-parallel ones: tensor, context,
// expert and pipeline.
void microbatch_exchanges(const PlanInputs& in, const StageTraffic& t, const Placement& at,
                          const Hardware& hw, StageSeconds& st) {
    const int64_t m = in.cfg.derived.grad_accum_steps;
    // A key/value head's replicas are tensor ranks: their gradient sums count as the group's.
    st.tensor = group_seconds(t.tensor, true, m, at.tensor_per_node, true, hw) +
                group_seconds(t.kv_replica, true, m, at.tensor_per_node, true, hw);
    // Ring attention's blocks and Ulysses' all-to-alls, none hidden under the attention.
    st.context = group_seconds(t.context, true, m, at.context_per_node, at.context_in_one_node, hw);
    // Expert parallelism's all-to-alls, none hidden under the experts' or attention's compute.
    st.expert = group_seconds(t.expert, true, m, at.expert_per_node, at.expert_in_one_node, hw);
    st.pipeline = group_seconds(t.pipeline, true, m, 1, at.grid_in_one_node, hw);
}

// A stage's share of the optimizer's whole-matrix steps (PlanInputs::matrix_step_flops), its
// `layers` of the model's, at the GEMMs' rate: each matrix is stepped by one rank of the
// stage's tensor and shard groups, in turns (optim/matrix_exchange.h), so the work is spread
// evenly over M·N ranks (docs/FORMULAS.md).
double matrix_step_seconds(const PlanInputs& in, int layers, const Hardware& hw) {
    const auto& p = in.cfg.parallel;
    const double share = static_cast<double>(layers) / in.cfg.model.layers;
    return in.matrix_step_flops * share / (p.tensor * p.shard_ranks()) / hw.gemm_flops;
}

// Stage s's compute, communication and optimizer seconds; `params` its parameters.
StageSeconds stage_seconds(const PlanInputs& in, int s, const StageTraffic& t, double params,
                           const Placement& at, const Hardware& hw) {
    const auto& p = in.cfg.parallel;
    const int64_t m = in.cfg.derived.grad_accum_steps;
    StageSeconds st;
    int layers = 0;
    for (const ChunkShape& chunk : stage_chunks(in.cfg, s)) {
        layers += chunk.layers;
        const ChunkSeconds c = chunk_seconds(in, chunk, hw);
        st.compute += c.forward + c.backward;
        st.forward += c.forward;
        st.backward += c.backward;
        st.weight += c.weight;
        st.flops += c.flops;
    }
    microbatch_exchanges(in, t, at, hw, st);
    // ZeRO 3's gathers of the weights come before each microbatch's forward and backward.
    st.data_gathers = group_seconds(t.data, true, m, at.data_per_node, true, hw);
    st.tensor_step = group_seconds(t.tensor, false, m, at.tensor_per_node, true, hw) +
                     group_seconds(t.kv_replica, false, m, at.tensor_per_node, true, hw);
    st.embedding = group_seconds(t.embedding, false, m, at.grid_in_one_node ? 2 : 1, true, hw);
    // Hybrid sharding's sums across the shard groups follow the step's reduction.
    // ... and so do the split experts' over their expert-shard group (not overlapped: an upper
    // bound).
    st.data = data_step_seconds(in, t.data, st, params, at.data_per_node, hw) +
              group_seconds(t.data_replica, false, m, at.replica_per_node, true, hw) +
              group_seconds(t.expert_shard, false, m, at.expert_shard_per_node, true, hw);
    const double owned = in.zero_stage >= 1 ? params / p.data : params;
    // Master weights and moments read and written; gradients read three times; weights
    // written.
    st.optimizer =
        owned * (2 * kOptimizerBytes + 3 * in.grad_bytes + in.weight_bytes) / hw.memory_bandwidth +
        matrix_step_seconds(in, layers, hw);
    if (in.cfg.optimizer.offload == config::Offload::nvme) {
        st.offload_io =
            (in.offload_reads + in.offload_writes) * owned * in.optimizer_bytes / hw.disk_bandwidth;
        // ZeRO-3's shard in its file: read for each gather (2m a step resharded after use,
        // else once) and written by the update (docs/FORMULAS.md).
        if (in.cfg.optimizer.offload_params)
            st.offload_io += owned * in.weight_bytes *
                             ((p.reshard_after_forward ? 2.0 * static_cast<double>(m) : 1.0) + 1) /
                             hw.disk_bandwidth;
        st.optimizer = std::max(st.optimizer, st.offload_io);
    } else if (in.cfg.optimizer.offload == config::Offload::host) {
        st.offload_io = owned * (in.grad_bytes + in.weight_bytes) / hw.host_link_bandwidth;
        st.optimizer = st.offload_io + owned * (2.0 * in.optimizer_bytes + 2 * sizeof(float)) /
                                           hw.host_memory_bandwidth;
    }
    return st;
}

// Seconds of pipeline fill and drain in a step of m microbatches, `slowest` the stage
// whose microbatches take longest.
double bubble_seconds(const config::Config& cfg, const StageSeconds& slowest, int64_t m,
                      BubbleCache& bubbles) {
    const auto& p = cfg.parallel;
    const pipeline::Kind kind = p.schedule;
    if (pipeline::splits_backward(kind) && p.pipeline > 1) {
        // The zero-bubble schedules' idle time depends on how the backward splits: replay
        // them with the slowest stage's forward, backward and W, in proportion to its time.
        const auto key = std::tuple{static_cast<int>(kind), p.pipeline,      p.virtual_stages,
                                    static_cast<int>(m),    slowest.forward, slowest.backward,
                                    slowest.weight};
        auto found = bubbles.find(key);
        if (found == bubbles.end()) {
            pipeline::Costs costs;
            costs.forward = slowest.forward;
            costs.backward = slowest.backward;
            costs.weight = slowest.weight;
            found = bubbles
                        .emplace(key, pipeline::simulate(kind, p.pipeline, p.virtual_stages,
                                                         static_cast<int>(m), costs)
                                          .bubble_fraction)
                        .first;
        }
        return found->second * static_cast<double>(m) * slowest.microbatch();
    }
    return static_cast<double>(p.pipeline - 1) / p.virtual_stages * slowest.microbatch();
}

}  // namespace

std::vector<double> microbatch_exchange_seconds(const PlanInputs& in, const Hardware& hw,
                                                const std::vector<StageTraffic>& traffic) {
    const Placement at = placement(in.cfg.parallel, hw.gpus_per_node);
    std::vector<double> seconds;
    for (const StageTraffic& t : traffic) {
        StageSeconds st;
        microbatch_exchanges(in, t, at, hw, st);
        seconds.push_back(st.tensor + st.context + st.expert + st.pipeline);
    }
    return seconds;
}

double step_lower_bound(const PlanInputs& in, const Hardware& hw,
                        const std::vector<ChunkSeconds>& compute,
                        const std::vector<double>& parameters,
                        const std::vector<double>& exchanges) {
    const config::Config& cfg = in.cfg;
    const auto& p = cfg.parallel;
    const int N = p.shard_ranks(), per_node = placement(p, hw.gpus_per_node).data_per_node;
    const bool sharded = in.zero_stage >= 2 && !cfg.training.lora.enabled();
    double slowest = 0, forward_share = 1;
    for (std::size_t s = 0; s < compute.size(); ++s) {
        const double seconds = compute[s].forward + compute[s].backward;
        if (seconds > 0) forward_share = std::min(forward_share, compute[s].forward / seconds);
        double exchanged = 0;
        if (sharded && p.sharded_accumulation)
            exchanged += collective_seconds(CommKind::reduce_scatter, parameters[s] * in.grad_bytes,
                                            N, per_node, hw);
        if (sharded && in.zero_stage == 3 && p.reshard_after_forward)
            exchanged += collective_seconds(CommKind::all_gather,
                                            parameters[s] / N * in.weight_bytes, N, per_node, hw);
        if (!exchanges.empty()) exchanged += exchanges[s];
        slowest = std::max(slowest, seconds + exchanged);
    }
    // PTD-P's bubble; the zero-bubble schedules' is at least the last stage's wait for the
    // first microbatch's forwards through the P - 1 stages before it.
    const double bubble = static_cast<double>(p.pipeline - 1) / p.virtual_stages *
                          (pipeline::splits_backward(p.schedule) ? forward_share : 1.0);
    // Below the sum the model forms term by term, whatever its rounding.
    return (static_cast<double>(cfg.derived.grad_accum_steps) + bubble) * slowest * (1 - 1e-9);
}

std::vector<std::string> hardware_presets() {
    std::vector<std::string> names;
    for (const Hardware& hw : presets()) names.push_back(hw.name);
    return names;
}

Hardware hardware_preset(std::string_view name) {
    std::string known;
    for (const Hardware& hw : presets()) {
        if (name == hw.name) return hw;
        known += (known.empty() ? "" : ", ") + hw.name;
    }
    throw Error("unknown hardware '" + std::string(name) + "' (presets: " + known + ")");
}

StepTime predict_step(const PlanInputs& in, const Hardware& hw) {
    BubbleCache bubbles;
    return predict_step(in, hw, plan_memory(in), bubbles);
}

StepTime predict_step(const PlanInputs& in, const Hardware& hw,
                      const std::vector<StageMemory>& memory, BubbleCache& bubbles) {
    const config::Config& cfg = in.cfg;
    const int64_t m = cfg.derived.grad_accum_steps;
    const std::vector<StageTraffic> traffic = plan_traffic(in, memory);
    const Placement at = placement(cfg.parallel, hw.gpus_per_node);
    std::vector<StageSeconds> stages;
    for (int s = 0; s < cfg.parallel.pipeline; ++s) {
        const auto i = static_cast<std::size_t>(s);
        const double params = static_cast<double>(memory[i].parameters);
        stages.push_back(stage_seconds(in, s, traffic[i], params, at, hw));
    }

    const auto slowest = std::max_element(stages.begin(), stages.end(),
                                          [](const StageSeconds& a, const StageSeconds& b) {
                                              return a.microbatch() < b.microbatch();
                                          });
    const auto last_done = std::max_element(stages.begin(), stages.end(),
                                            [](const StageSeconds& a, const StageSeconds& b) {
                                                return a.after_flush() < b.after_flush();
                                            });
    const double mb = static_cast<double>(m);
    StepTime r;
    r.slowest_stage = static_cast<int>(slowest - stages.begin());
    r.compute = mb * slowest->compute;
    r.tensor_comm = mb * slowest->tensor + last_done->tensor_step;
    r.context_comm = mb * slowest->context;
    r.expert_comm = mb * slowest->expert;
    r.pipeline_comm = mb * slowest->pipeline + last_done->embedding;
    r.bubble = bubble_seconds(cfg, *slowest, m, bubbles);
    r.data_comm = mb * slowest->data_gathers + last_done->data;
    r.optimizer = last_done->optimizer;
    r.offload_io = last_done->offload_io;
    r.step = r.compute + r.tensor_comm + r.context_comm + r.expert_comm + r.pipeline_comm +
             r.bubble + r.data_comm + r.optimizer;
    r.executed_flops = mb * slowest->flops;
    return r;
}

}  // namespace trident::plan
