// Per-stage memory of a training run (see memory_model.h).
#include "plan/memory_model.h"

#include <algorithm>
#include <functional>
#include <memory>

#include "config/model_shape.h"
#include "data_parallel/data_parallel.h"
#include "model/model_spec.h"
#include "model/nf4_base.h"
#include "model/param_layout.h"
#include "model/stage_parts.h"
#include "optim/optimizer.h"
#include "optim/owned_ranges.h"
#include "optim/update.h"
#include "plan/stage_shape.h"

namespace trident::plan {

namespace {

// The step's two device totals, the loss and the gradient norm's square (model/gpt.h,
// src/optim/adamw.h): a double each, in the backend's smallest allocation (64 bytes on the
// CPU; a GPU's caching allocator rounds them up further, a few hundred bytes in all).
constexpr int64_t kDeviceTotals = 2 * 64;

// Where a non-finite step was first seen (src/train/first_sighting.h): one more double, held
// on every rank of a grid of more than one.
constexpr int64_t kFirstSighting = 64;

// The stage's parts as the model builds them (model/stage_parts.h), on a CPU, low-rank
// adapters included: the buffers they declare are what the model allocates.
model::StageParts stage_parts(const config::Config& cfg, const model::ParamLayout& layout,
                              const model::Dims& d) {
    const model::Lora lora = config::lora_of(cfg);
    const model::PartOptions options{static_cast<float>(cfg.model.dropout),
                                     lora,
                                     kernels::cpu_attention_saved,
                                     {},
                                     nullptr,
                                     cfg.data.documents == config::DocumentMode::mask};
    return model::build_stage(
        layout,
        model::ParamLayout::for_lora(layout.shape(), lora.shape, layout.tensor_rank(), layout.M(),
                                     layout.plan()),
        d, options);
}

// The CPU backend's attention-gradient workspace (none for ring attention's blocks): the
// probabilities' gradient, as large as what attention keeps (kernels::cpu_attention_saved).
int64_t attention_workspace_bytes(const model::Dims& d) {
    if (d.ring()) return 0;
    const int heads = d.ulysses() ? d.heads / d.C : d.heads;
    const kernels::Ops::AttentionSaved w =
        kernels::cpu_attention_saved(d.B, heads, d.seq_len, d.act);
    return static_cast<int64_t>(w.count * kernels::size_of(w.dtype));
}

// One rank's sizes, its activations of the plan's element size.
model::Dims plan_dims(const PlanInputs& in) {
    model::Dims d = config::rank_dims(in.cfg);
    const kernels::DType precision = in.cfg.training.precision;
    d.act = in.activation_bytes == 4           ? kernels::DType::f32
            : precision == kernels::DType::f32 ? kernels::DType::bf16
                                               : precision;
    return d;
}

// Everything but the sets: the model's scratch, the recompute scratch (with what a deferred
// attention's W reads), the attention workspace and the step's device totals (`ranks`: the
// grid's size).
int64_t temporary_bytes(const model::StageParts& parts, const model::KeepPolicy& policy,
                        const model::Dims& d, int ranks) {
    int64_t bytes = static_cast<int64_t>(parts.scratch.bytes()) + attention_workspace_bytes(d) +
                    kDeviceTotals + (ranks > 1 ? kFirstSighting : 0);
    bytes += static_cast<int64_t>(model::recompute_scratch_bytes(parts.layer_specs(), policy));
    return bytes;
}

// ZeRO-3's gathered weights at most, of `layout`'s units of `sizes` elements (`buffer` in
// all), in bytes: the two largest (and a tied embedding the head reads), or all of them kept
// through the step.
double gathered_units(const PlanInputs& in, const model::ParamLayout& layout,
                      std::vector<std::size_t> sizes, double buffer) {
    if (in.zero_stage != 3) return 0;
    if (!in.cfg.parallel.reshard_after_forward) return buffer * in.weight_bytes;
    std::sort(sizes.begin(), sizes.end(), std::greater<>());
    std::size_t held = 0;
    for (std::size_t i = 0; i < std::min<std::size_t>(2, sizes.size()); ++i) held += sizes[i];
    const auto [embedding_begin, embedding_end] = layout.embedding_range();
    if (layout.shape().tied && layout.plan().stages == 1) held += embedding_end - embedding_begin;
    return static_cast<double>(held) * in.weight_bytes;
}

// ZeRO-3's gathered units of a 4-bit base's bytes at most, as gathered_bytes counts the
// weights': the two largest groups, or all of them kept through the step.
double gathered_codes(const PlanInputs& in, const kernels::Nf4Store& store) {
    if (in.zero_stage != 3) return 0;
    if (!in.cfg.parallel.reshard_after_forward) return static_cast<double>(store.bytes());
    std::vector<std::size_t> sizes;
    for (const auto& [begin, end] : store.groups()) sizes.push_back(end - begin);
    std::sort(sizes.begin(), sizes.end(), std::greater<>());
    double held = 0;
    for (std::size_t i = 0; i < std::min<std::size_t>(2, sizes.size()); ++i)
        held += static_cast<double>(sizes[i]);
    return held;
}

// Low-rank adapters (docs/ARCHITECTURE.md, "Low-rank adapters"): the model's weights stay
// (whole, or at ZeRO-3 a D-th), but it has no gradients and no optimizer state; the adapters'
// buffer (its layer units aligned to D at ZeRO 2 and 3, as the model's) has weights,
// gradients and state, sharded by the same stages.
void add_adapters(const PlanInputs& in, const model::ParamLayout& layout, StageMemory& s) {
    const auto& p = in.cfg.parallel;
    // Sharded over the shard group (parallel.data_shard; all D·C ranks by default), as the
    // model's own buffers (stage_states).
    const int64_t D = p.shard_ranks();
    const model::ParamLayout adapters_layout =
        model::ParamLayout::for_lora(layout.shape(), config::lora_of(in.cfg).shape, 0, p.tensor,
                                     layout.plan(), in.zero_stage >= 2 ? static_cast<int>(D) : 1);
    const int64_t adapters = (static_cast<int64_t>(adapters_layout.total()) + D - 1) / D * D;
    const ModelStates trained = model_states(static_cast<double>(adapters), static_cast<int>(D),
                                             in.zero_stage, in.weight_bytes, in.grad_bytes);
    s.states.weights += trained.weights;
    s.states.gradients = trained.gradients;
    s.states.optimizer = trained.optimizer;
    s.parameters += adapters;
    // A 4-bit base (model/nf4_base.h): its store of codes and constants (at ZeRO-3 this rank's
    // share of each unit's, padded, and the units gathered at once as the weights' are), and
    // the tile its linears are dequantized into (the longest run of adjacent matrices); below
    // ZeRO-3 its layer matrices leave the dense buffer.
    const config::LoraConfig& lora = in.cfg.training.lora;
    if (!lora.quantized()) return;
    int64_t quantized = 0, tile = 0;
    for (const auto& [begin, end] : model::quantized_ranges(layout)) {
        quantized += static_cast<int64_t>(end - begin);
        tile = std::max(tile, static_cast<int64_t>(end - begin));
    }
    const model::BufferPlan plan{static_cast<std::size_t>(p.shard_ranks()), 0, false,
                                 in.zero_stage >= 3, false};
    const kernels::Nf4Store store = model::quantized_store(
        layout, static_cast<std::size_t>(lora.quant_block), lora.double_quant, plan);
    s.states.weights += static_cast<double>(store.bytes() / plan.multiple) +
                        static_cast<double>(tile * in.weight_bytes);
    if (in.zero_stage < 3) {
        s.parameters -= quantized;
        s.states.weights -= static_cast<double>(quantized * in.weight_bytes);
        return;
    }
    // Sharded, each unit of the dense buffer holds its elements past the matrices, padded to
    // a multiple of N (model/flat_buffer.h); the layer's codes are gathered beside them.
    const auto N = static_cast<std::size_t>(D);
    std::vector<std::size_t> sizes;
    std::size_t held = 0;
    for (const auto& [begin, end] : layout.unit_ranges()) {
        std::size_t size = end - begin;
        for (const auto& [q_begin, q_end] : model::quantized_ranges(layout))
            if (q_end > begin && q_begin < end)
                size -= std::min(q_end, end) - std::max(q_begin, begin);
        sizes.push_back((size + N - 1) / N * N);
        held += sizes.back();
    }
    const auto dense = static_cast<int64_t>((layout.total() + N - 1) / N * N);
    s.parameters -= dense - static_cast<int64_t>(held);
    s.states.weights -=
        static_cast<double>((dense - static_cast<int64_t>(held)) * in.weight_bytes) /
        static_cast<double>(N);
    s.gathered =
        gathered_units(in, layout, sizes, static_cast<double>(held)) + gathered_codes(in, store);
}

}  // namespace

int weight_bytes(kernels::DType precision) {
    return precision == kernels::DType::f32 ? 4 : 2;
}

int gradient_bytes(kernels::DType precision, bool fp32_grad_accumulation) {
    return precision == kernels::DType::f32 || fp32_grad_accumulation ? 4 : 2;
}

int activation_bytes(kernels::DType precision) {
    return precision == kernels::DType::f32 ? 4 : 2;
}

namespace {

// The whole-matrix steps of one update over the model's layers (PlanInputs).
double matrix_step_flops(const config::Config& cfg) {
    const std::unique_ptr<optim::Optimizer> o = optim::make_optimizer(cfg.training, cfg.optimizer);
    if (!o->whole_matrices()) return 0;
    const model::ModelSpec spec = model::resolve_spec(config::gpt_shape(cfg));
    double flops = 0;
    for (int l = 0; l < cfg.model.layers; ++l)
        for (const model::PartDecl& part : spec.layer_decls(l))
            for (const model::TensorDecl& t : part.tensors)
                if (t.shape.size() == 2)
                    flops += o->matrix_step_flops(static_cast<std::size_t>(t.shape[0]),
                                                  static_cast<std::size_t>(t.shape[1]));
    return flops;
}

}  // namespace

PlanInputs plan_inputs(const config::Config& cfg, int grad_bytes) {
    PlanInputs in;
    in.cfg = cfg;
    in.weight_bytes = weight_bytes(cfg.training.precision);
    in.grad_bytes = grad_bytes;
    in.activation_bytes = activation_bytes(cfg.training.precision);
    in.zero_stage = cfg.parallel.zero_stage;
    const optim::StateBytes state = optim::state_bytes(cfg.training, cfg.optimizer);
    in.matrix_optimizer_bytes = static_cast<int>(state.matrix);
    in.optimizer_bytes = static_cast<int>(state.other);
    in.matrix_step_flops = matrix_step_flops(cfg);
    const optim::StatePasses passes = optim::state_passes(cfg.training, cfg.optimizer);
    in.offload_reads = passes.read;
    in.offload_writes = passes.written;
    return in;
}

double PlanInputs::attended() const {
    if (doc_len == 0) return 1;
    return std::min(1.0, static_cast<double>(doc_len) / cfg.model.seq_len);
}

OptimizerBytes optimizer_bytes(const PlanInputs& in, const model::ParamLayout& layout) {
    OptimizerBytes bytes{in.optimizer_bytes, 0, in.matrix_optimizer_bytes};
    if (bytes.per_matrix_parameter != bytes.per_parameter)
        bytes.matrices = static_cast<double>(optim::matrix_split(layout).matrix_parameters);
    const std::unique_ptr<optim::Optimizer> o =
        optim::make_optimizer(in.cfg.training, in.cfg.optimizer);
    // Rank 0 owns the first matrix of each group's turns (optim/matrix_exchange.h).
    const config::ParallelConfig& p = in.cfg.parallel;
    const auto M = static_cast<std::size_t>(layout.M());
    const auto owners = static_cast<std::size_t>(p.shard_ranks()) * M;
    const auto expert_owners = static_cast<std::size_t>(p.expert_shard_ranks()) * M;
    bytes.owned = static_cast<double>(optim::matrix_state_bytes(*o, layout, owners, expert_owners));
    return bytes;
}

ModelStates model_states(double parameters, int data_parallel, int zero_stage, int weight_bytes,
                         int grad_bytes, const OptimizerBytes& optimizer) {
    const double D = data_parallel;
    ModelStates s;
    s.weights = parameters * weight_bytes / (zero_stage >= 3 ? D : 1.0);
    s.gradients = parameters * grad_bytes / (zero_stage >= 2 ? D : 1.0);
    s.optimizer = optimizer.of(parameters) / (zero_stage >= 1 ? D : 1.0) + optimizer.owned;
    return s;
}

double korthikanti_layer_bytes(const config::Config& cfg) {
    using config::Recompute;
    const double s = cfg.model.seq_len, b = cfg.training.micro_batch, h = cfg.model.hidden,
                 a = cfg.model.heads, t = cfg.parallel.tensor;
    const bool sp = cfg.parallel.sequence_parallel && t > 1;
    const double sbh = s * b * h;
    // The layer's parts' terms (model/part_kinds.h): GPT-2's 10 + 24 + 5·a·s/h (Korthikanti et
    // al., §4.1, masks and dropout copies included), llama's 8 + 4 + 4·g/a + 6·f/h + 2·a·s/h
    // (docs/FORMULAS.md).
    const model::ActivationTerms k =
        model::resolve_spec(config::gpt_shape(cfg)).layer_activations(0, cfg.parallel.tensor);
    // Context parallelism holds a C-th of every term (s/C tokens, their scores against all s).
    const double C = cfg.parallel.context;
    const double whole = k.replicated + k.split;
    switch (cfg.training.recompute) {
        case Recompute::full:
            return (sp ? 2 * sbh / t : 2 * sbh) / C;
        case Recompute::selective:
            return (sp ? whole * sbh / t : sbh * (k.replicated + k.split / t)) / C;
        case Recompute::none:
            break;
    }
    const double attention = k.scores * a * s / (h * t);
    return (sp ? sbh * (whole / t + attention) : sbh * (k.replicated + k.split / t + attention)) /
           C;
}

namespace {

// The elements of a sharded buffer of `buffer` elements of `layout` one of its N ranks holds:
// an N-th of each unit, and of a run of the experts held an (N/E)-th.
double sharded_elements(const model::ParamLayout& layout, int64_t buffer, int64_t N) {
    const int64_t E = layout.plan().experts;
    int64_t runs = 0;
    for (const auto& [begin, end] : layout.expert_runs()) runs += static_cast<int64_t>(end - begin);
    return static_cast<double>((buffer - runs) / N + runs / (N / E));
}

// ZeRO-3's gathered units at most (see the top of memory_model.h), in bytes.
double gathered_bytes(const PlanInputs& in, const model::ParamLayout& layout, int64_t buffer) {
    std::vector<std::size_t> sizes;
    for (const auto& [begin, end] : layout.unit_ranges()) sizes.push_back(end - begin);
    return gathered_units(in, layout, sizes, static_cast<double>(buffer));
}

// The optimizer state replica 0 of the shard group holds on the device: its owned parts as the
// data-parallel module cuts the `buffer` elements (data_parallel::make_buckets), each of the
// optimizer's arrays over its group's elements among them (optim::owned_state_bytes: Muon's
// momentum over the layer matrices' alone), and the per-matrix state it owns.
double held_optimizer_bytes(const PlanInputs& in, const model::ParamLayout& layout,
                            int64_t buffer) {
    std::vector<model::ModelUnit> units;
    for (const auto& [begin, end] : layout.unit_ranges())
        units.push_back(model::ModelUnit{"", {begin, end}, {0, 0}, {0, 0}, false});
    const auto parts = data_parallel::owned_parts(data_parallel::make_buckets(
        units, static_cast<std::size_t>(buffer), in.zero_stage,
        static_cast<std::size_t>(in.cfg.parallel.shard_ranks()), 0,
        static_cast<std::size_t>(in.cfg.parallel.bucket_size),
        data_parallel::ExpertRuns{
            layout.expert_runs(),
            static_cast<std::size_t>(in.cfg.parallel.shard_ranks() / layout.plan().experts), 0}));
    std::size_t owned = 0;
    for (const data_parallel::OwnedPart& p : parts) owned += p.count;
    const std::unique_ptr<optim::Optimizer> o =
        optim::make_optimizer(in.cfg.training, in.cfg.optimizer);
    return static_cast<double>(
               optim::owned_state_bytes(*o, optim::owned_ranges(layout, parts), owned)) +
           optimizer_bytes(in, layout).owned;
}

}  // namespace

model::ParamLayout stage_layout(const PlanInputs& in, int stage) {
    const config::Config& cfg = in.cfg;
    // At stages 2 and 3 each unit of the layout is padded so that ZeRO splits it evenly over
    // the ranks it shards over, and so is each run of the experts split over E
    // (model/param_layout.h); expert rank 0's, as large as every other's.
    const std::size_t N = static_cast<std::size_t>(cfg.parallel.shard_ranks());
    const model::StagePlan plan = config::stage_plan(cfg, stage);
    return model::ParamLayout(config::gpt_shape(cfg), 0, cfg.parallel.tensor, plan,
                              in.zero_stage >= 2 || plan.experts > 1 ? N : 1);
}

StageMemory stage_states(const PlanInputs& in, const model::ParamLayout& layout) {
    const config::Config& cfg = in.cfg;
    StageMemory s;
    s.stage = layout.plan().stage;
    // Padded so that ZeRO splits it evenly over the ranks it shards over (Gpt's
    // buffer_multiple): the N ranks of the shard group (parallel.data_shard; all D·C of the
    // data-context group by default). Hybrid sharding holds a N-th, not a D·C-th.
    const int64_t N = cfg.parallel.shard_ranks();
    s.parameters = (static_cast<int64_t>(layout.total()) + N - 1) / N * N;
    s.states = model_states(static_cast<double>(s.parameters), static_cast<int>(N), in.zero_stage,
                            in.weight_bytes, in.grad_bytes, optimizer_bytes(in, layout));
    // Arrays kept for one group of parameters only (Muon's, GaLore's), or split experts (their
    // state sharded over the N/E expert-shard ranks alone): replica 0's share of each group,
    // exactly; else every owned element alike, model_states' figure.
    if (in.matrix_optimizer_bytes != in.optimizer_bytes || !layout.expert_runs().empty())
        s.states.optimizer = held_optimizer_bytes(in, layout, s.parameters);
    // Sharded, a run of the experts held splits over the N/E expert-shard ranks alone
    // (model/flat_buffer.h): E times an N-th of it.
    const double shard = sharded_elements(layout, s.parameters, N);
    if (in.zero_stage >= 2) s.states.gradients = shard * in.grad_bytes;
    if (in.zero_stage >= 3) s.states.weights = shard * in.weight_bytes;
    s.gathered = gathered_bytes(in, layout, s.parameters);
    if (cfg.training.lora.enabled()) add_adapters(in, layout, s);
    // Off the device: the state per element (every array for every parameter, in.optimizer_bytes
    // each); the per-matrix state (GaLore's) stays on the device with its owner.
    const double per_matrix = optimizer_bytes(in, layout).owned;
    if (cfg.optimizer.offload == config::Offload::nvme) {
        s.offloaded = s.states.optimizer - per_matrix;
        s.states.optimizer = std::min(s.offloaded, static_cast<double>(in.optimizer_bytes) *
                                                       cfg.optimizer.offload_chunk) +
                             per_matrix;
    } else if (cfg.optimizer.offload == config::Offload::host) {
        s.offloaded = s.states.optimizer - per_matrix;  // the update runs there
        s.states.optimizer = per_matrix;
    }
    if (cfg.optimizer.offload_params) {  // ZeRO-3's weight shard in its file too
        s.offloaded += s.states.weights;
        s.states.weights = 0;
    }
    return s;
}

StageBuffers stage_buffers(const PlanInputs& in, const model::ParamLayout& layout) {
    const config::Config& cfg = in.cfg;
    const model::Dims d = plan_dims(in);
    const model::KeepPolicy policy{cfg.training.recompute,
                                   pipeline::splits_backward(cfg.parallel.schedule),
                                   cfg.parallel.ep_overlap};
    const model::StageParts parts = stage_parts(cfg, layout, d);
    StageBuffers b;
    for (const model::ChunkSpec& chunk : parts.chunks)
        b.set_bytes.push_back(static_cast<double>(model::set_bytes(chunk, policy)));
    b.temporary = static_cast<double>(temporary_bytes(parts, policy, d, cfg.derived.world_size));
    // A matrix optimizer's scratch (optim/update.h, matrix_scratch), held with its state.
    const std::unique_ptr<optim::Optimizer> o = optim::make_optimizer(cfg.training, cfg.optimizer);
    b.temporary += static_cast<double>(optim::matrix_scratch(*o, layout) * sizeof(float));
    b.message = static_cast<double>(d.rows_mine()) * d.H * in.activation_bytes;
    return b;
}

std::vector<StageMemory> plan_memory(const PlanInputs& in) {
    const config::Config& cfg = in.cfg;
    const double korthikanti_layer = korthikanti_layer_bytes(cfg) * in.activation_bytes / 2.0;
    const std::vector<InFlight> flights = in_flight(cfg);
    std::vector<StageMemory> stages;
    for (int stage = 0; stage < cfg.parallel.pipeline; ++stage) {
        const model::ParamLayout layout = stage_layout(in, stage);
        StageMemory s = stage_states(in, layout);
        const StageBuffers buffers = stage_buffers(in, layout);
        const std::vector<ChunkShape> chunks = stage_chunks(cfg, stage);
        const InFlight& flight = flights[static_cast<std::size_t>(stage)];
        for (std::size_t c = 0; c < chunks.size(); ++c) {
            const int sets = flight.sets[c];
            s.activation_sets += sets;
            s.activations += sets * buffers.set_bytes[c];
            s.korthikanti += sets * chunks[c].layers * korthikanti_layer;
        }
        s.temporary = buffers.temporary + flight.messages * buffers.message;
        stages.push_back(s);
    }
    return stages;
}

}  // namespace trident::plan
