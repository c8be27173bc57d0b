// Per-group traffic of one step (see communication.h).
#include "plan/communication.h"

#include <algorithm>
#include <numeric>

#include "config/model_shape.h"
#include "data_parallel/data_parallel.h"
#include "model/param_layout.h"
#include "model/part_kinds.h"
#include "plan/stage_shape.h"

namespace trident::plan {

namespace {

using parallel::CommKind;

// A step's scalars (a loss, a gradient norm's sum of squares) travel as one double.
constexpr double kScalar = 1;
constexpr int kScalarBytes = 8;

void add(GroupTraffic& g, CommKind kind, int64_t calls, double elements, int element_bytes,
         bool per_microbatch, int pieces = 1) {
    if (g.size > 1 && calls > 0)
        g.calls.push_back({kind, calls, elements, element_bytes, per_microbatch, pieces});
}

// The tensor group: the model's f and g operators, the vocab-parallel embedding and loss, and
// of the stage's `moe` MoE layers their shared experts' and the choices' weight gradients.
void tensor_traffic(const PlanInputs& in, const std::vector<ChunkShape>& chunks, bool last_stage,
                    int64_t moe, GroupTraffic& g) {
    const config::Config& cfg = in.cfg;
    const model::Dims d = config::rank_dims(cfg);
    const int act = in.activation_bytes;
    const int64_t m = cfg.derived.grad_accum_steps;
    const bool full = cfg.training.recompute == config::Recompute::full;
    int64_t layers = 0, embeds = 0, heads = 0;
    for (const ChunkShape& c : chunks) {
        layers += c.layers;
        embeds += c.embeds;
        heads += c.head;
    }
    // A row-parallel output summed (all-reduce, or reduce-scatter to this rank's rows) and,
    // with sequence parallelism, a column-parallel input gathered: per layer 2 of each
    // forward, 2 backward, and under full recompute 1 reduction and 2 gathers more. An MoE
    // layer's shared experts (model/moe_mlp.cpp) are an MLP of their own: 1 of each more
    // forward and backward, and 1 gather more under full recompute.
    const int64_t shared = cfg.model.moe.shared_experts > 0 ? moe : 0;
    const int64_t reductions = layers * (4 + (full ? 1 : 0)) + 2 * shared + embeds + heads;
    const int64_t gathers =
        layers * (4 + (full ? 2 : 0)) + shared * (2 + (full ? 1 : 0)) + embeds + heads;
    const double NC = static_cast<double>(d.N) * d.H, RC = static_cast<double>(d.R) * d.H;
    if (d.sequence_parallel) {
        // With tp_overlap the split linears' (all but the embedding's) go in M pieces.
        const int pieces = d.tp_overlap ? d.M : 1;
        const int64_t whole = d.tp_overlap ? embeds : 0;
        add(g, CommKind::reduce_scatter, m * (reductions - whole), NC, act, true, pieces);
        add(g, CommKind::all_gather, m * (gathers - whole), RC, act, true, pieces);
        add(g, CommKind::reduce_scatter, m * whole, NC, act, true);
        add(g, CommKind::all_gather, m * whole, RC, act, true);
        // The norms' gradients, summed over the rows of every rank (per step): each tensor the
        // layers' two norms and the final norm declare (GPT-2's LayerNorms a weight and a bias,
        // llama's RMSNorms a weight).
        const model::ModelSpec spec = model::resolve_spec(config::gpt_shape(cfg));
        const auto tensors = [&](const model::NormKind* norm) {
            return static_cast<int64_t>(norm->declare(spec.shape).tensors.size());
        };
        add(g, CommKind::all_reduce,
            2 * layers * tensors(spec.layers[0].norm) + (last_stage ? tensors(spec.final_norm) : 0),
            static_cast<double>(d.H), in.grad_bytes, false);
    } else {
        add(g, CommKind::all_reduce, m * reductions, NC, act, true);
    }
    // Each routed choice's weight gradient, a dot product of the tensor ranks' partial outputs:
    // K = N·k fp32 summed per MoE layer and microbatch, backward.
    add(g, CommKind::all_reduce, m * moe, static_cast<double>(d.N) * cfg.model.moe.top_k, 4, true);
    // The loss: each row's maximum, then its sum of exponentials and target logit, in fp32.
    add(g, CommKind::all_reduce, m * heads, static_cast<double>(d.N), 4, true);
    add(g, CommKind::all_reduce, m * heads, 2.0 * static_cast<double>(d.N), 4, true);
    add(g, CommKind::all_reduce, 1, kScalar, kScalarBytes, false);  // the gradient norm
}

// ZeRO-3's all-gathers of one unit [begin, end) of the layout in a step (model/gpt.cpp's
// hooks). Without resharding after use: one, kept from its first use to the step's end.
// Otherwise one per use of every microbatch: its forward; its backward, unless only the
// embedding reads it (the embedding's gradient is a scatter of the output's, which reads
// no weight) and not a tied LM head on the same stage; and a zero-bubble W (split backward)
// only under full recompute, whose rerun forward reads the weights: a weight gradient alone
// is the saved input's product with the output's gradient.
int64_t unit_gathers(const config::Config& cfg, const model::ParamLayout& layout,
                     std::pair<std::size_t, std::size_t> unit) {
    if (!cfg.parallel.reshard_after_forward) return 1;
    const auto [embedding_begin, embedding_end] = layout.embedding_range();
    const bool embedding = unit.first >= embedding_begin && unit.second <= embedding_end;
    const bool head_reads = layout.shape().tied && layout.plan().last() &&
                            layout.wte() >= unit.first && layout.wte() < unit.second;
    const bool backward = !embedding || head_reads;
    const bool w = backward && pipeline::splits_backward(cfg.parallel.schedule) &&
                   cfg.training.recompute == config::Recompute::full;
    return cfg.derived.grad_accum_steps * (1 + (backward ? 1 : 0) + (w ? 1 : 0));
}

// ZeRO-2 and 3 (src/data_parallel/zero_units.h): each unit of the layout reduce-scattered after
// every microbatch's backward (sharded accumulation) or after the step's last; stage 2 all-gathers
// the updated units as stage 1 its buckets, stage 3 gathers each unit as unit_gathers counts
// and nothing after the update; with hybrid sharding each rank's part is all-reduced across
// the shard groups once a step. Where the experts split, a unit's run of the experts held goes
// over the N/E expert-shard ranks instead (model/flat_buffer.h), its parts summed over the
// replica group alike.
void sharded_data_traffic(const PlanInputs& in, int stage, StageTraffic& t) {
    const auto& p = in.cfg.parallel;
    const int64_t m = in.cfg.derived.grad_accum_steps;
    const int N = p.shard_ranks();
    const model::ParamLayout layout(config::gpt_shape(in.cfg), 0, p.tensor,
                                    config::stage_plan(in.cfg, stage), static_cast<std::size_t>(N));
    const int64_t reductions = p.sharded_accumulation ? m : 1;
    const auto piece = [&](std::pair<std::size_t, std::size_t> unit, std::size_t begin,
                           std::size_t end, bool experts) {
        if (begin == end) return;
        GroupTraffic& g = experts ? t.expert_shard : t.data;
        const double size = static_cast<double>(end - begin);
        const double part = size / (experts ? N / layout.plan().experts : N);
        add(g, CommKind::reduce_scatter, reductions, size, in.grad_bytes, p.sharded_accumulation);
        if (in.zero_stage == 2)
            add(g, CommKind::all_gather, 1, part, in.weight_bytes, false);
        else
            add(g, CommKind::all_gather, unit_gathers(in.cfg, layout, unit), part, in.weight_bytes,
                p.reshard_after_forward);
        if (t.data_replica.size > 1)
            add(t.data_replica, CommKind::all_reduce, 1, part, in.grad_bytes, false);
    };
    auto run = layout.expert_runs().begin();
    for (const auto& unit : layout.unit_ranges()) {
        std::size_t begin = unit.first;
        for (; run != layout.expert_runs().end() && run->first < unit.second; ++run) {
            piece(unit, begin, run->first, false);
            piece(unit, run->first, run->second, true);
            begin = run->second;
        }
        piece(unit, begin, unit.second, false);
    }
    add(t.data, CommKind::all_reduce, 1, kScalar, kScalarBytes,
        false);  // the gradient norm's share
    add(t.data, CommKind::all_reduce, 1, kScalar, kScalarBytes,
        false);  // the loss, averaged over replicas
}

// ZeRO 0 and 1 with the experts' weights split (config::expert_shards): the data-parallel
// module's buckets (data_parallel::make_buckets) of the stage's layout, a run of the experts
// held summed, and at stage 1 sharded and gathered, over the expert-shard group (with hybrid
// sharding each owned part then summed over the replica group, the experts' as the rest's); the
// gradient norm's share of the experts over the expert group when nothing is sharded
// (optim/clipping.h).
void split_experts_traffic(const PlanInputs& in, int stage, StageTraffic& t) {
    const auto& p = in.cfg.parallel;
    const model::ParamLayout layout = stage_layout(in, stage);
    const std::size_t N = static_cast<std::size_t>(p.shard_ranks());
    const std::size_t E = static_cast<std::size_t>(layout.plan().experts);
    const std::size_t buffer = (layout.total() + N - 1) / N * N;
    for (const data_parallel::Bucket& b : data_parallel::make_buckets(
             {}, buffer, in.zero_stage, N, 0, static_cast<std::size_t>(p.bucket_size),
             data_parallel::ExpertRuns{layout.expert_runs(), N / E, 0})) {
        GroupTraffic& g = b.experts ? t.expert_shard : t.data;
        const double size = static_cast<double>(b.size);
        if (in.zero_stage == 0) {
            add(g, CommKind::all_reduce, 1, size, in.grad_bytes, false);
        } else {
            add(g, CommKind::reduce_scatter, 1, size, in.grad_bytes, false);
            add(g, CommKind::all_gather, 1, static_cast<double>(b.owned), in.weight_bytes, false);
            add(t.data_replica, CommKind::all_reduce, 1, static_cast<double>(b.owned),
                in.grad_bytes, false);
        }
    }
    add(in.zero_stage >= 1 ? t.data : t.expert, CommKind::all_reduce, 1, kScalar, kScalarBytes,
        false);  // the gradient norm's share
    add(t.data, CommKind::all_reduce, 1, kScalar, kScalarBytes,
        false);  // the loss, averaged over replicas
}

// The context group (model/context_attention.cpp), per layer and microbatch: ring attention
// sends C − 1 blocks of keys and values (N, 2H/M) in the forward, as many again in the
// backward with C blocks of their fp32 gradients; Ulysses all-to-alls q, k, v (N, 3H/M) and
// the output (N, H/M) forward and their gradients backward. Full recompute reruns the forward.
// Each forward of the stage's `moe` MoE layers sums its routing's figures over the group
// (model/moe_mlp.cpp, count_load): 2·N_e + 2 fp32.
void context_traffic(const PlanInputs& in, const std::vector<ChunkShape>& chunks, int64_t moe,
                     GroupTraffic& g) {
    const config::Config& cfg = in.cfg;
    const model::Dims d = config::rank_dims(cfg);
    const int64_t m = cfg.derived.grad_accum_steps, C = d.C;
    int64_t layers = 0;
    for (const ChunkShape& c : chunks) layers += c.layers;
    const int64_t forwards = cfg.training.recompute == config::Recompute::full ? 2 : 1;
    const double NCm = static_cast<double>(d.N) * d.Hm;
    if (d.ring()) {
        add(g, CommKind::send, m * layers * (forwards + 1) * (C - 1), 2 * NCm, in.activation_bytes,
            true);
        add(g, CommKind::send, m * layers * C, 2 * NCm, 4, true);
    } else {
        add(g, CommKind::all_to_all, m * layers * 2 * (forwards + 1), 2 * NCm, in.activation_bytes,
            true);
    }
    add(g, CommKind::all_reduce, m * moe * forwards, 2.0 * cfg.model.moe.experts + 2, 4, true);
}

// The data group: the optimizer's reduction of the stage's flat buffers (optim/adamw.cpp).
// With hybrid sharding it is the shard group of N ranks, and each bucket's N-th is summed
// across the replica group too.
void data_traffic(const PlanInputs& in, int64_t buffer, GroupTraffic& g, GroupTraffic& replicas) {
    const int64_t D = in.cfg.parallel.shard_ranks();
    // Buckets of a multiple of D parameters, the last one what is left.
    const int64_t bucket = std::max(D, in.cfg.parallel.bucket_size / D * D);
    const int64_t full = buffer / bucket, rest = buffer % bucket;
    const std::pair<int64_t, int64_t> buckets[] = {{full, bucket}, {int64_t{rest > 0}, rest}};
    if (in.zero_stage == 0) {
        for (const auto& [count, size] : buckets)
            add(g, CommKind::all_reduce, count, static_cast<double>(size), in.grad_bytes, false);
    } else {
        for (const auto& [count, size] : buckets) {
            add(g, CommKind::reduce_scatter, count, static_cast<double>(size), in.grad_bytes,
                false);
            add(g, CommKind::all_gather, count, static_cast<double>(size / D), in.weight_bytes,
                false);
            add(replicas, CommKind::all_reduce, count, static_cast<double>(size / D), in.grad_bytes,
                false);
        }
        add(g, CommKind::all_reduce, 1, kScalar, kScalarBytes, false);  // the gradient norm's share
    }
    add(g, CommKind::all_reduce, 1, kScalar, kScalarBytes,
        false);  // the loss, averaged over replicas
}

// The expert group, per MoE layer and microbatch (model/moe_mlp.cpp): the counts' all-to-all
// (N experts' i32 counts in all) and the rows' two (K, H) forward, as many again under full
// recompute, and two backward. The rows a rank gets back to combine are those its experts
// received, which depend on the routing: counted as what it sent, exact when every rank's
// experts receive alike (the expectation under balanced routing, always when top_k = N).
void expert_traffic(const PlanInputs& in, int64_t layers, GroupTraffic& g) {
    const config::Config& cfg = in.cfg;
    const model::Dims d = config::rank_dims(cfg);
    const int64_t m = cfg.derived.grad_accum_steps;
    const int64_t forwards = cfg.training.recompute == config::Recompute::full ? 2 : 1;
    const double K = static_cast<double>(d.N) * cfg.model.moe.top_k;
    add(g, CommKind::all_to_all, m * layers * forwards, cfg.model.moe.experts, 4, true);
    add(g, CommKind::all_to_all, m * layers * 2 * (forwards + 1), K * d.H, in.activation_bytes,
        true);
}

// A mixture of experts' losses and loads of the step (src/train/trainer.cpp): 2 + L·(N + 1)
// doubles summed over the pipeline, then over the data-context group, once a step.
void moe_sums_traffic(const config::Config& cfg, GroupTraffic& pipeline, GroupTraffic& data) {
    const model::MoeSettings& moe = cfg.model.moe;
    if (!moe.enabled()) return;
    const double values = 2.0 + static_cast<double>(cfg.model.layers) * (moe.experts + 1);
    add(pipeline, CommKind::all_reduce, 1, values, kScalarBytes, false);
    add(data, CommKind::all_reduce, 1, values, kScalarBytes, false);
}

// The replicas of a key/value head (M > KVH): each layer's k and v rows' gradients (2·d·H
// per layer, d the head size) summed over them when the layer's gradients are reduced: once a
// step, or after every microbatch when ZeRO 2 and 3 reduce sharded gradients each time.
void kv_replica_traffic(const PlanInputs& in, const std::vector<ChunkShape>& chunks,
                        GroupTraffic& g) {
    const config::Config& cfg = in.cfg;
    const model::Dims d = config::rank_dims(cfg);
    int64_t layers = 0;
    for (const ChunkShape& c : chunks) layers += c.layers;
    const bool every_microbatch = in.zero_stage >= 2 && cfg.parallel.sharded_accumulation;
    const int64_t calls = layers * (every_microbatch ? cfg.derived.grad_accum_steps : 1);
    add(g, CommKind::all_reduce, calls, 2.0 * d.kv_heads * (d.H / cfg.model.heads) * d.H,
        in.grad_bytes, every_microbatch);
}

}  // namespace

double sent_per_call(CommKind kind, double payload, int n) {
    switch (kind) {
        case CommKind::all_reduce:
            return 2.0 * (n - 1) / n * payload;
        case CommKind::reduce_scatter:
            return static_cast<double>(n - 1) / n * payload;
        case CommKind::all_gather:
            return static_cast<double>(n - 1) * payload;
        case CommKind::all_to_all:  // all but this rank's own block leaves it
            return static_cast<double>(n - 1) / n * payload;
        case CommKind::broadcast:
        case CommKind::send:
        case CommKind::recv:
        case CommKind::count_:
            break;
    }
    return payload;
}

int64_t GroupTraffic::call_count() const {
    int64_t n = 0;
    for (const Calls& c : calls) n += c.calls;
    return n;
}

double GroupTraffic::payload_bytes() const {
    double bytes = 0;
    for (const Calls& c : calls)
        bytes += static_cast<double>(c.calls) * c.elements * c.element_bytes;
    return bytes;
}

double GroupTraffic::sent_bytes() const {
    double bytes = 0;
    for (const Calls& c : calls)
        bytes += static_cast<double>(c.calls) *
                 sent_per_call(c.kind, c.elements * c.element_bytes, size);
    return bytes;
}

int64_t moe_layers(const config::Config& cfg, int stage) {
    const model::MoeSettings& moe = cfg.model.moe;
    if (!moe.enabled()) return 0;
    const auto& p = cfg.parallel;
    const model::ChunkMap map = pipeline::chunk_map(p.schedule, p.pipeline, p.virtual_stages);
    const std::vector<int>& cut = cfg.derived.chunk_layers;
    int64_t count = 0;
    for (int c = 0; c < p.virtual_stages; ++c) {
        const int g = map.global(stage, c);
        const int first = std::accumulate(cut.begin(), cut.begin() + g, 0);
        for (int l = first; l < first + cut[static_cast<std::size_t>(g)]; ++l)
            count += moe.moe_layer(l) ? 1 : 0;
    }
    return count;
}

std::vector<StageTraffic> plan_traffic(const PlanInputs& in) {
    return plan_traffic(in, plan_memory(in));
}

std::vector<StageTraffic> plan_traffic(const PlanInputs& in,
                                       const std::vector<StageMemory>& memory) {
    const config::Config& cfg = in.cfg;
    const auto& p = cfg.parallel;
    const model::Dims d = config::rank_dims(cfg);
    const int64_t m = cfg.derived.grad_accum_steps;
    std::vector<StageTraffic> stages;
    for (int stage = 0; stage < p.pipeline; ++stage) {
        const std::vector<ChunkShape> chunks = stage_chunks(cfg, stage);
        const bool first = stage == 0;
        const bool last =
            std::any_of(chunks.begin(), chunks.end(), [](const ChunkShape& c) { return c.head; });
        StageTraffic t;
        t.tensor.size = p.tensor;
        t.pipeline.size = p.pipeline;
        // The tied weight's two stages (ZB-V holds both ends on stage 0: no exchange).
        t.embedding.size = p.pipeline > 1 && first != last ? 2 : 1;
        t.context.size = p.context;
        t.data.size = p.shard_ranks();
        t.data_replica.size = p.data * p.context / p.shard_ranks();
        t.kv_replica.size = model::kv_replicas(cfg.model.kv_heads, p.tensor);
        t.expert.size = p.expert;
        t.expert_shard.size = p.expert_shard_ranks();

        const int64_t moe = moe_layers(cfg, stage);
        tensor_traffic(in, chunks, last, moe, t.tensor);
        context_traffic(in, chunks, moe, t.context);
        kv_replica_traffic(in, chunks, t.kv_replica);
        expert_traffic(in, moe, t.expert);

        // Every chunk but the last global one sends its output on; every one but the first
        // sends its input's gradient back; but at ZB-V's turn, where the next chunk is on the
        // same stage.
        const model::ChunkMap map = pipeline::chunk_map(p.schedule, p.pipeline, p.virtual_stages);
        int64_t sends = 0;
        for (int c = 0; c < p.virtual_stages; ++c) {
            const int g = map.global(stage, c);
            sends += (g < map.last() && map.stage_of(g + 1) != stage) +
                     (g > 0 && map.stage_of(g - 1) != stage);
        }
        add(t.pipeline, CommKind::send, m * sends, static_cast<double>(d.R) * d.H,
            in.activation_bytes, true);
        add(t.pipeline, CommKind::broadcast, 1, kScalar, kScalarBytes,
            false);  // the loss, from the last
        add(t.pipeline, CommKind::all_reduce, 1, kScalar, kScalarBytes,
            false);  // the gradient norm

        // A tied embedding's two copies, the embedding's on the first stage and the LM head's
        // on the last, have their gradients summed (train/trainer.cpp); an untied model's
        // head is a weight of its own, and adapters leave wte frozen. ZeRO-2 sums the tied
        // copies on the shards: each replica its part of wte's unit.
        if (cfg.model.tie_embeddings && !cfg.training.lora.enabled()) {
            const int64_t wte = cfg.derived.padded_vocab / p.tensor * cfg.model.hidden;
            const int64_t N = p.shard_ranks();
            add(t.embedding, CommKind::all_reduce, 1,
                static_cast<double>(in.zero_stage >= 2 ? (wte + N - 1) / N : wte), in.grad_bytes,
                false);
        }

        if (in.zero_stage >= 2)
            sharded_data_traffic(in, stage, t);
        else if (config::expert_shards(p) > 1)
            split_experts_traffic(in, stage, t);
        else
            data_traffic(in, memory[static_cast<std::size_t>(stage)].parameters, t.data,
                         t.data_replica);
        moe_sums_traffic(cfg, t.pipeline, t.data);
        stages.push_back(t);
    }
    return stages;
}

}  // namespace trident::plan
