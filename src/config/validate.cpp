// Validation of a loaded config: required keys, each key's range (from the key table), what
// this build cannot run yet, and the keys against each other. Every error points at the line
// or --set override that set the value at fault.
#include <algorithm>
#include <string>
#include <string_view>
#include <utility>

#include "config/model_shape.h"
#include "config/schema.h"
#include "model/model_spec.h"
#include "model/part_kinds.h"

namespace trident::config::detail {
namespace {

[[noreturn]] void fail(const std::string& where, const std::string& message) {
    throw ConfigError(where + ": " + message);
}

// Message text from pieces: cat("layers (", 12, ") ..."). Doubles print as format_number does.
void append(std::string& out, std::string_view text) {
    out += text;
}
void append(std::string& out, int v) {
    out += std::to_string(v);
}
void append(std::string& out, double v) {
    out += format_number(v);
}

template <typename... Parts>
std::string cat(const Parts&... parts) {
    std::string out;
    (append(out, parts), ...);
    return out;
}

void check_required(const Origins& origins, Purpose purpose) {
    for (const Key& key : keys()) {
        if (!key.required || origins.is_set(key.path)) continue;
        // Only training reads the data: bench runs on random tokens, plan runs nothing.
        if (purpose != Purpose::train && section_of(key.path) == "data") continue;
        fail(origins.file(), cat(key.path, ": required key missing"));
    }
}

void check_ranges(const Config& cfg, const Origins& origins) {
    for (const Key& key : keys())
        if (Problem problem = key.check_range(cfg))
            fail(origins.where(key.path), cat(key.path, ": ", *problem));
}

// Settings this build reads but cannot run (a GPU where the build has no GPU backend, what the
// GPU backend lacks); a plan models them all the same.
void refuse_unsupported_features([[maybe_unused]] const Config& cfg,
                                 [[maybe_unused]] const Origins& origins) {
#if !TRIDENT_HAVE_CUDA
    // With the GPU backend built in, whether each rank has a GPU is found at start-up
    // (commands/session.h), not here: a config names a device, the machine may lack it.
    if (cfg.device == DeviceKind::cuda)
        fail(origins.where("device"),
             "device: this build has no CUDA backend (built without the CUDA toolkit; use auto or "
             "cpu)");
#endif
}

// Limits that tie keys together (below). Each message starts with the key it blames first.

// The model's shape, the optimizer's limits, the step's batch and the evaluation set.
void check_model_and_batches(const Config& cfg, const Origins& origins) {
    const ModelConfig& m = cfg.model;
    const ParallelConfig& p = cfg.parallel;
    const TrainingConfig& t = cfg.training;

    if (m.head_dim == 0 && m.hidden % m.heads != 0)
        fail(origins.blame({"model.hidden", "model.heads"}),
             cat("model.hidden (", m.hidden, ") must be a multiple of model.heads (", m.heads,
                 ") unless model.head_dim gives the heads' width"));

    if (t.min_loss_scale > t.loss_scale)
        fail(origins.blame({"training.min_loss_scale", "training.loss_scale"}),
             cat("training.min_loss_scale (", t.min_loss_scale,
                 ") must not exceed training.loss_scale (", t.loss_scale, ")"));
    if (t.min_lr > t.lr)
        fail(origins.blame({"training.min_lr", "training.lr"}),
             cat("training.min_lr (", t.min_lr, ") must not exceed training.lr (", t.lr, ")"));

    // Every step splits the global batch into equal microbatches on every DP rank.
    const int per_step = t.micro_batch * p.data;
    if (t.global_batch % per_step != 0)
        fail(origins.blame({"training.global_batch", "training.micro_batch", "parallel.data"}),
             cat("training.global_batch (", t.global_batch,
                 ") must be a multiple of micro_batch × parallel.data = ", t.micro_batch, " × ",
                 p.data, " = ", per_step));

    // Each replica evaluates its equal share of the evaluation set in whole microbatches.
    if (t.eval_sequences % per_step != 0)
        fail(origins.blame({"training.eval_sequences", "training.micro_batch", "parallel.data"}),
             cat("training.eval_sequences (", t.eval_sequences,
                 ") must be a multiple of micro_batch × parallel.data = ", t.micro_batch, " × ",
                 p.data, " = ", per_step,
                 " (each replica evaluates its share in whole microbatches; a multiple of "
                 "training.global_batch suits every layout)"));
}

// What model.moe does not run yet: the bias's update with the state in a file, losses over
// counted tokens.
void check_moe_built(const Config& cfg, const Origins& origins) {
    const MoeSettings& moe = cfg.model.moe;
    // The bias moves in the master weights (optim/update.h, Updater::add_to_master), which a
    // file would have to be read and written whole for.
    if (moe.bias_update_rate > 0 && cfg.optimizer.offload == Offload::nvme)
        fail(origins.blame({"model.moe.bias_update_rate", "optimizer.offload"}),
             cat("model.moe.bias_update_rate (", moe.bias_update_rate,
                 ") with optimizer.offload: nvme is not built yet: the router's bias moves in "
                 "the master weights (optimizer.offload: none or host)"));
    // The balancing and z losses are averaged over the microbatches, as the cross-entropy is
    // by default; over counted tokens they are not yet defined.
    if (cfg.training.loss_normalization == LossNormalization::tokens || cfg.data.mask_eod_loss)
        fail(origins.blame(
                 {"training.loss_normalization", "data.mask_eod_loss", "model.moe.experts"}),
             "training.loss_normalization: tokens (or data.mask_eod_loss) with model.moe is not "
             "built yet: the balancing losses are averaged over microbatches");
}

// Adapters on a mixture of experts' model (docs/FEATURES.md, "LoRA") wrap its attention alone:
// every MLP stays frozen, the experts, the shared experts and the dense layers' alike (an MLP
// adapted on its dense layers only would be half of what the target asks). The router's bias
// is part of the frozen base, which an adapters file does not carry and a resume reads again:
// it does not move. A 4-bit base's matrices are not in the dense buffer the experts read.
void check_moe_lora(const Config& cfg, const Origins& origins) {
    const LoraConfig& lora = cfg.training.lora;
    const MoeSettings& moe = cfg.model.moe;
    if (!lora.enabled()) return;
    for (const LoraTarget target : lora.targets)
        if (target == LoraTarget::gate || target == LoraTarget::up || target == LoraTarget::down)
            fail(origins.blame({"training.lora.targets", "model.moe.experts"}),
                 cat("training.lora.targets: ", to_string(target), " with model.moe.experts (",
                     moe.experts,
                     ") is not built: a mixture of experts' adapters wrap its "
                     "attention (q, k, v, o); its MLPs, experts and dense, stay frozen"));
    if (moe.bias_update_rate > 0)
        fail(origins.blame({"model.moe.bias_update_rate", "training.lora.rank"}),
             cat("model.moe.bias_update_rate (", moe.bias_update_rate,
                 ") with training.lora.rank > 0: the router's bias is part of the frozen base "
                 "(an adapters file does not carry it); set the rate to 0"));
    if (lora.quantized())
        fail(origins.blame({"training.lora.quantize", "model.moe.experts"}),
             "training.lora.quantize: nf4 with model.moe.experts > 0 is not built yet: the "
             "router and the experts read their weights dense");
}

// model.moe: the family takes it, k of the N experts, the bias only beside a sigmoid router.
void check_moe(const Config& cfg, const Origins& origins) {
    const MoeSettings& moe = cfg.model.moe;
    if (!moe.enabled()) return;
    if (!model::arch_defaults(cfg.model.arch, cfg.model.hidden).moe)
        fail(origins.blame({"model.moe.experts", "model.arch"}),
             cat("model.moe.experts (", moe.experts, ") needs model.arch: llama (it is ",
                 enum_name(cfg.model.arch), "): the experts are SwiGLU MLPs"));
    if (moe.top_k > moe.experts)
        fail(origins.blame({"model.moe.top_k", "model.moe.experts"}),
             cat("model.moe.top_k (", moe.top_k, ") must not exceed model.moe.experts (",
                 moe.experts, "): each token goes to top_k distinct experts"));
    if (cfg.model.ffn_hidden > 0 &&
        (moe.ffn_hidden ? moe.ffn_hidden : cfg.model.ffn_hidden) % cfg.parallel.tensor != 0)
        fail(origins.blame({"model.moe.ffn_hidden", "model.ffn_hidden", "parallel.tensor"}),
             cat("model.moe.ffn_hidden (", moe.ffn_hidden ? moe.ffn_hidden : cfg.model.ffn_hidden,
                 ") must be a multiple of parallel.tensor (", cfg.parallel.tensor,
                 "): each expert splits over the tensor ranks as the dense MLP"));
    if (moe.bias_update_rate > 0 && moe.router != MoeRouter::sigmoid)
        fail(origins.blame({"model.moe.bias_update_rate", "model.moe.router"}),
             cat("model.moe.bias_update_rate (", moe.bias_update_rate,
                 ") needs model.moe.router: sigmoid (DeepSeek-V3's balancing biases the "
                 "selection of sigmoid scores; it is softmax)"));
    check_moe_built(cfg, origins);
    check_moe_lora(cfg, origins);
}

// parallel.expert: E ranks of the data-context group split an MoE layer's experts.
void check_expert_parallel(const Config& cfg, const Origins& origins) {
    const ParallelConfig& p = cfg.parallel;
    if (p.expert == 1) return;
    const int data_context = p.data * p.context;
    if (!cfg.model.moe.enabled())
        fail(origins.blame({"parallel.expert", "model.moe.experts"}),
             cat("parallel.expert (", p.expert,
                 ") needs model.moe.experts > 0: it splits the experts of the MoE layers"));
    if (data_context % p.expert != 0)
        fail(origins.blame({"parallel.expert", "parallel.data", "parallel.context"}),
             cat("parallel.expert (", p.expert, ") must divide parallel.data × parallel.context (",
                 p.data, " × ", p.context, " = ", data_context,
                 "): the experts split over ranks of the data-context group"));
    if (cfg.model.moe.experts % p.expert != 0)
        fail(origins.blame({"parallel.expert", "model.moe.experts"}),
             cat("model.moe.experts (", cfg.model.moe.experts,
                 ") must be a multiple of parallel.expert (", p.expert,
                 "): each expert rank holds as many experts"));
}

// How tensor, sequence and context parallelism split the heads, widths and rows.
void check_tensor_and_context(const Config& cfg, const Origins& origins) {
    const ModelConfig& m = cfg.model;
    const ParallelConfig& p = cfg.parallel;
    const TrainingConfig& t = cfg.training;
    // Tensor parallelism splits heads and the MLP width evenly over M.
    if (m.heads % p.tensor != 0)
        fail(origins.blame({"parallel.tensor", "model.heads"}),
             cat("parallel.tensor (", p.tensor, ") must divide model.heads (", m.heads, ")"));
    if (m.ffn_hidden % p.tensor != 0)
        fail(origins.blame({"parallel.tensor", "model.ffn_hidden"}),
             cat("parallel.tensor (", p.tensor, ") must divide model.ffn_hidden (", m.ffn_hidden,
                 ")"));

    // Context parallelism cuts every sequence into 2·C equal chunks and gives rank i chunks i
    // and 2C − 1 − i, so that causal attention's work is the same on every rank.
    if (p.context > 1 && m.seq_len % (2 * p.context) != 0)
        fail(
            origins.blame({"model.seq_len", "parallel.context"}),
            cat("model.seq_len (", m.seq_len, ") must be a multiple of 2 × parallel.context = 2 × ",
                p.context, " = ", 2 * p.context,
                " (each context rank takes two of 2·C equal chunks of every sequence, for causal "
                "load balancing)"));
    // Ulysses gives each of the M·C ranks of a layer whole heads.
    if (p.context > 1 && p.context_mode == ContextMode::ulysses &&
        m.heads % (p.tensor * p.context) != 0)
        fail(
            origins.blame(
                {"parallel.context_mode", "parallel.context", "parallel.tensor", "model.heads"}),
            cat("parallel.context_mode: ulysses splits the heads over parallel.tensor × context = ",
                p.tensor, " × ", p.context, " = ", p.tensor * p.context,
                " ranks, which must divide model.heads (", m.heads, ")"));

    // Sequence parallelism splits each microbatch's B·T/C rows of the residual stream over M.
    const int rows = t.micro_batch * (m.seq_len / p.context);
    if (p.sequence_parallel && rows % p.tensor != 0)
        fail(origins.blame({"parallel.sequence_parallel", "training.micro_batch", "model.seq_len",
                            "parallel.context", "parallel.tensor"}),
             p.context == 1
                 ? cat("parallel.sequence_parallel: micro_batch × seq_len = ", t.micro_batch, " × ",
                       m.seq_len, " rows must divide by parallel.tensor (", p.tensor, ")")
                 : cat("parallel.sequence_parallel: micro_batch × seq_len / context = ",
                       t.micro_batch, " × ", m.seq_len, " / ", p.context, " = ", rows,
                       " rows must divide by parallel.tensor (", p.tensor, ")"));
    // The overlap cuts the sequence-parallel exchanges into pieces: without them nothing to cut.
    if (p.tp_overlap && (!p.sequence_parallel || p.tensor == 1))
        fail(
            origins.blame({"parallel.tp_overlap", "parallel.sequence_parallel", "parallel.tensor"}),
            cat("parallel.tp_overlap: true overlaps sequence parallelism's all-gathers and "
                "reduce-scatters with the GEMMs; it needs parallel.sequence_parallel: true and "
                "parallel.tensor > 1 (here sequence_parallel ",
                p.sequence_parallel ? "true" : "false", ", tensor ", p.tensor, ")"));
}

// How the pipeline cuts the layers and schedules the microbatches.
void check_pipeline(const Config& cfg, const Origins& origins) {
    const ModelConfig& m = cfg.model;
    const ParallelConfig& p = cfg.parallel;
    const TrainingConfig& t = cfg.training;
    // The layers are cut into P·v model chunks: equal ones, or the counts given.
    const int chunks = p.pipeline * p.virtual_stages;
    const StageLayers& cut = p.stage_layers;
    if (cut.cut == StageCut::uniform && m.layers % chunks != 0)
        fail(origins.blame({"model.layers", "parallel.pipeline", "parallel.virtual_stages",
                            "parallel.stage_layers"}),
             cat("model.layers (", m.layers,
                 ") must be a multiple of parallel.pipeline × virtual_stages = ", p.pipeline, " × ",
                 p.virtual_stages, " = ", chunks,
                 " for parallel.stage_layers: uniform (auto or a list of counts cuts unequally)"));
    if (cut.cut == StageCut::given) {
        int total = 0;
        for (int n : cut.layers) total += n;
        if (static_cast<int>(cut.layers.size()) != chunks)
            fail(origins.blame(
                     {"parallel.stage_layers", "parallel.pipeline", "parallel.virtual_stages"}),
                 cat("parallel.stage_layers: ", static_cast<int>(cut.layers.size()),
                     " counts given, but the model has ", "parallel.pipeline × virtual_stages = ",
                     chunks, " chunks (one count per chunk)"));
        else if (total != m.layers)
            fail(origins.blame({"parallel.stage_layers", "model.layers"}),
                 cat("parallel.stage_layers: the counts add up to ", total,
                     ", but model.layers is ", m.layers));
    }

    // Virtual stages only mean something to the interleaved schedule and ZB-V, and they
    // need them: ZB-V's V exactly two (it sets 2 when unset).
    const bool interleaved = p.schedule == pipeline::Kind::interleaved;
    if (p.schedule == pipeline::Kind::zb_v) {
        if (p.pipeline < 2)
            fail(
                origins.blame({"parallel.schedule", "parallel.pipeline"}),
                cat("parallel.schedule: zb-v needs parallel.pipeline >= 2 (got ", p.pipeline, ")"));
        if (p.virtual_stages != 2)
            fail(origins.blame({"parallel.virtual_stages", "parallel.schedule"}),
                 cat("parallel.schedule: zb-v places two chunks per stage in a V; "
                     "parallel.virtual_stages must be 2 or unset (got ",
                     p.virtual_stages, ")"));
    } else if (p.virtual_stages > 1 && !interleaved)
        fail(origins.blame({"parallel.virtual_stages", "parallel.schedule"}),
             cat("parallel.virtual_stages (", p.virtual_stages,
                 ") needs parallel.schedule: interleaved (got ", to_string(p.schedule), ")"));
    if (interleaved && p.pipeline < 2)
        fail(origins.blame({"parallel.schedule", "parallel.pipeline"}),
             cat("parallel.schedule: interleaved needs parallel.pipeline >= 2 (got ", p.pipeline,
                 ")"));
    if (interleaved && p.virtual_stages < 2)
        fail(origins.blame({"parallel.schedule", "parallel.virtual_stages"}),
             cat("parallel.schedule: interleaved needs parallel.virtual_stages >= 2 (got ",
                 p.virtual_stages, ")"));

    // The interleaved schedule runs microbatches in groups of P (PTD-P §2.2).
    const int microbatches = t.global_batch / (t.micro_batch * p.data);
    if (interleaved && microbatches % p.pipeline != 0)
        fail(origins.blame({"parallel.schedule", "parallel.pipeline", "training.global_batch",
                            "training.micro_batch", "parallel.data"}),
             cat("parallel.schedule: interleaved needs the microbatches per step (global_batch / "
                 "(micro_batch "
                 "× parallel.data) = ",
                 microbatches, ") to be a multiple of parallel.pipeline (", p.pipeline, ")"));
}

// Each kind of layer adapts the linears its parts declare (docs/ARCHITECTURE.md,
// "Vocabulary"); the message names the layer's attention and MLP kinds.
void check_lora_targets(const Config& cfg, const Origins& origins) {
    const model::ModelSpec spec = model::resolve_spec(config::gpt_shape(cfg));
    const std::vector<model::LinearDecl> linears = spec.layer_linears(0);
    std::string names;
    for (const model::LinearDecl& w : linears)
        names += (names.empty() ? "" : ", ") + std::string(model::lora_target_name(w.target));
    const model::LayerSpec& layer = spec.layers.front();
    for (const LoraTarget target : cfg.training.lora.targets)
        if (std::none_of(linears.begin(), linears.end(),
                         [&](const model::LinearDecl& w) { return w.target == target; }))
            fail(origins.blame({"training.lora.targets", "model.arch", "model.mlp"}),
                 cat("training.lora.targets: ", to_string(target),
                     " is not a linear of the layer (", layer.attention->name, " attention, ",
                     layer.mlp->name, " MLP): its targets are ", names));
}

// A 4-bit base (training.lora.quantize: nf4; model/nf4_base.h) is a LoRA run's, and its blocks
// lie along the rows each tensor rank holds of every layer matrix.
void check_quantized_base(const Config& cfg, const Origins& origins) {
    const LoraConfig& lora = cfg.training.lora;
    // A map given sets each of its parts: a value other than the default is what tells.
    const LoraConfig defaults;
    if (!lora.quantized()) {
        if (lora.quant_block != defaults.quant_block)
            fail(origins.blame({"training.lora.quant_block", "training.lora.quantize"}),
                 cat("training.lora.quant_block (", lora.quant_block,
                     ") needs training.lora.quantize: nf4"));
        if (lora.double_quant != defaults.double_quant)
            fail(origins.blame({"training.lora.double_quant", "training.lora.quantize"}),
                 "training.lora.double_quant: false needs training.lora.quantize: nf4");
        return;
    }
    if (!lora.enabled())
        fail(origins.blame({"training.lora.quantize", "training.lora.rank"}),
             "training.lora.quantize: nf4 needs training.lora.rank > 0 (it holds a LoRA run's "
             "frozen base in 4 bits)");
    const int M = cfg.parallel.tensor;
    const model::ModelSpec spec = model::resolve_spec(config::gpt_shape(cfg));
    for (const model::LinearDecl& w : spec.layer_linears(0)) {
        const int row = static_cast<int>(w.split.kind == model::SplitKind::row ? w.in / M : w.in);
        if (row % lora.quant_block != 0)
            fail(origins.blame({"training.lora.quant_block", "parallel.tensor", "model.hidden"}),
                 cat("training.lora.quant_block (", lora.quant_block, ") must divide the rows ",
                     "each tensor rank holds of every layer matrix: ", w.name, "'s are ", row,
                     " long"));
    }
}

// What ZeRO's stages and LoRA combine with.
void check_zero_and_lora(const Config& cfg, const Origins& origins) {
    const ModelConfig& m = cfg.model;
    const ParallelConfig& p = cfg.parallel;
    const TrainingConfig& t = cfg.training;
    // Keeping gathered units through the step is a choice of ZeRO-3's gathers only.
    if (!p.reshard_after_forward && p.zero_stage != 3)
        fail(origins.blame({"parallel.reshard_after_forward", "parallel.zero_stage"}),
             cat("parallel.reshard_after_forward: false needs parallel.zero_stage 3 (got ",
                 p.zero_stage, "): below stage 3 the parameters are whole on every replica"));

    // Hybrid sharding cuts the D·C data-context ranks into equal runs, and shards ZeRO's state
    // over each: stage 0 shards nothing.
    const int data_context = p.data * p.context;
    if (p.data_shard != 0 && data_context % p.data_shard != 0)
        fail(origins.blame({"parallel.data_shard", "parallel.data", "parallel.context"}),
             cat("parallel.data_shard (", p.data_shard,
                 ") must divide parallel.data × parallel.context (", p.data, " × ", p.context,
                 " = ", data_context, ")"));
    if (p.data_shard != 0 && p.data_shard != data_context && p.zero_stage == 0)
        fail(origins.blame({"parallel.data_shard", "parallel.zero_stage"}),
             cat("parallel.data_shard (", p.data_shard,
                 ") shards ZeRO's state; parallel.zero_stage 0 shards nothing (use 1, 2 or 3)"));
    // With hybrid sharding the experts split within each shard group: each group holds every
    // expert, so that the shard groups stay replicas of one another.
    if (p.data_shard != 0 && p.data_shard != data_context && p.data_shard % p.expert != 0)
        fail(origins.blame({"parallel.expert", "parallel.data_shard"}),
             cat("parallel.expert (", p.expert, ") must divide parallel.data_shard (", p.data_shard,
                 "): the experts split within each shard group"));

    // LoRA trains low-rank adapters beside a frozen model (Hu et al. 2021): its rank is at most
    // the width of the layers it adapts, and starting adapters need adapters to start.
    const LoraConfig& lora = t.lora;
    if (lora.init_from && !lora.enabled())
        fail(origins.blame({"training.lora.init_from", "training.lora.rank"}),
             "training.lora.init_from needs training.lora.rank > 0");
    if (lora.rank > m.hidden)
        fail(origins.blame({"training.lora.rank", "model.hidden"}),
             cat("training.lora.rank (", lora.rank, ") must not exceed model.hidden (", m.hidden,
                 ")"));
    if (lora.enabled()) check_lora_targets(cfg, origins);
    check_quantized_base(cfg, origins);
}

// The layer's keys, each read by the kind of part that takes it (model/part_kinds.h): fewer
// key/value heads by a grouped attention, rotary positions' base by a rotary one, the norms'
// epsilon by a norm that takes one; an untied head by a spec that may have one. GPT-2's layer
// takes none of them.
void check_part_keys(const ModelConfig& m, const model::ModelSpec& spec, const Origins& origins) {
    const model::LayerSpec& layer = spec.layers.front();
    if (!layer.attention->grouped && m.kv_heads != m.heads)
        fail(origins.blame({"model.kv_heads", "model.arch"}),
             cat("model.kv_heads (", m.kv_heads, ") differs from model.heads (", m.heads,
                 "): grouped-query attention needs model.arch: llama"));
    if (!layer.attention->rotary && m.rope_theta != 10000.0)
        fail(origins.blame({"model.rope_theta", "model.arch"}),
             cat("model.rope_theta (", m.rope_theta,
                 ") sets llama's rotary positions; GPT-2 learns its position embedding "
                 "(model.arch: gpt2)"));
    if (!layer.norm->eps && m.norm_eps != 1e-5)
        fail(origins.blame({"model.norm_eps", "model.arch"}),
             cat("model.norm_eps (", m.norm_eps,
                 ") sets llama's RMSNorm; GPT-2's LayerNorm has eps 1e-5 (model.arch: gpt2)"));
    if (m.head_dim > 0 && !layer.attention->grouped)
        fail(origins.blame({"model.head_dim", "model.arch"}),
             cat("model.head_dim (", m.head_dim,
                 ") sets the heads' width of llama's grouped-query attention; GPT-2's heads are "
                 "model.hidden / model.heads wide (the layer's attention is ",
                 layer.attention->name, ")"));
    if (m.qk_norm && !layer.attention->qk_norm)
        fail(origins.blame({"model.qk_norm", "model.arch"}),
             cat("model.qk_norm: true needs model.arch: llama (it normalizes each query and key "
                 "head of grouped-query attention; the layer's is ",
                 layer.attention->name, ")"));
    if (!spec.untied_head && !m.tie_embeddings)
        fail(origins.blame({"model.tie_embeddings", "model.arch"}),
             "model.tie_embeddings: false needs model.arch: llama (GPT-2's LM head is its "
             "token embedding)");
}

// The attention's shape: rotary positions need an even head size, and tensor parallelism
// whole key/value heads (with as many of them as query heads, check_tensor_and_context's
// rules cover it).
void check_architecture(const Config& cfg, const Origins& origins) {
    const ModelConfig& m = cfg.model;
    const ParallelConfig& p = cfg.parallel;
    if (m.heads % m.kv_heads != 0)
        fail(origins.blame({"model.kv_heads", "model.heads"}),
             cat("model.kv_heads (", m.kv_heads, ") must divide model.heads (", m.heads,
                 "): each key/value head serves heads / kv_heads query heads"));
    const model::ModelSpec spec = model::resolve_spec(config::gpt_shape(cfg));
    check_part_keys(m, spec, origins);
    const model::AttentionKind& attention = *spec.layers.front().attention;
    const int head_size = config::gpt_shape(cfg).head_size();
    if (attention.rotary && head_size % 2 != 0)
        fail(origins.blame({"model.hidden", "model.heads", "model.head_dim", "model.arch"}),
             cat("model.arch: llama rotates pairs of channels: the head size (model.head_dim, "
                 "else model.hidden / model.heads) = ",
                 head_size, " must be even"));
    if (!attention.grouped) return;
    // Tensor parallelism splits the key/value heads with the query heads, or, with fewer of
    // them than ranks, gives each run of M / kv_heads ranks one head whole (a replica).
    if (m.kv_heads % p.tensor != 0 && p.tensor % m.kv_heads != 0)
        fail(origins.blame({"parallel.tensor", "model.kv_heads"}),
             cat("parallel.tensor (", p.tensor, ") must divide model.kv_heads (", m.kv_heads,
                 ") or be a multiple of it: each tensor rank holds whole key/value heads"));
    if (cfg.training.lora.enabled() && p.tensor > m.kv_heads)
        fail(origins.blame({"training.lora.rank", "parallel.tensor", "model.kv_heads"}),
             cat("training.lora.rank > 0 with parallel.tensor (", p.tensor,
                 ") above model.kv_heads (", m.kv_heads,
                 "): adapters of key/value heads replicated over tensor ranks are not built"));
}

// Low-rank adapters train with AdamW (their A and B are not the layers' matrices).
void check_optimizer(const Config& cfg, const Origins& origins) {
    if (cfg.optimizer.name != OptimizerName::adamw && cfg.training.lora.enabled())
        fail(
            origins.blame({"optimizer.name", "training.lora.rank"}),
            cat("optimizer.name: ", enum_name(cfg.optimizer.name),
                " with training.lora.rank > 0: adapters train with AdamW (optimizer.name: adamw)"));
}

// Where the optimizer state, and ZeRO-3's parameter shard, go. The directory itself (there,
// writable, room for this rank's files) is checked as the run starts (io/offload_file.h).
void check_offload(const Config& cfg, const Origins& origins) {
    const OptimizerConfig& o = cfg.optimizer;
    if (o.offload == Offload::nvme && !o.offload_dir)
        fail(origins.blame({"optimizer.offload", "optimizer.offload_dir"}),
             "optimizer.offload: nvme needs optimizer.offload_dir, the directory of the state "
             "files (one per rank)");
    // The parameter shard's file sits beside the state's, and the streamed update writes it.
    if (o.offload_params && cfg.parallel.zero_stage != 3)
        fail(origins.blame({"optimizer.offload_params", "parallel.zero_stage"}),
             cat("optimizer.offload_params: true needs parallel.zero_stage: 3 (it is ",
                 cfg.parallel.zero_stage, "): only ZeRO-3 shards the parameters"));
    if (o.offload_params && o.offload != Offload::nvme)
        fail(origins.blame({"optimizer.offload_params", "optimizer.offload"}),
             "optimizer.offload_params: true needs optimizer.offload: nvme: the parameter shard "
             "goes to a file in optimizer.offload_dir, beside the optimizer state's");
    if (o.offload_params && cfg.training.lora.enabled())
        fail(origins.blame({"optimizer.offload_params", "training.lora.rank"}),
             "optimizer.offload_params: true with training.lora.rank > 0 is not built: the "
             "frozen model's shard is gathered apart from the adapters' and stays in memory");
}

}  // namespace

// Packed documents (model/documents.h): an eod token in the vocabulary, a llama's named, and
// (the GPU's is refused beside what this build cannot run, above). Nothing is asked of
// data.eod_token while no document is read.
void check_documents(const Config& cfg, const Origins& origins) {
    const DataConfig& d = cfg.data;
    const bool mask = d.documents == DocumentMode::mask;
    if (!mask && !d.mask_eod_loss) return;
    const char* uses = mask ? "data.documents: mask" : "data.mask_eod_loss";
    if (!origins.is_set("data.eod_token") &&
        !model::arch_defaults(cfg.model.arch, cfg.model.hidden).eod_token)
        fail(origins.file(),
             cat("data.eod_token: required with ", uses, " for a ", to_string(cfg.model.arch),
                 " model whose model.init_from names no eos_token_id (config.json) nor eos_token "
                 "(tokenizer_config.json)"));
    if (d.eod_token >= cfg.model.vocab_size)
        fail(origins.blame({"data.eod_token", "model.vocab_size"}),
             cat("data.eod_token: ", d.eod_token, " is outside the vocabulary (model.vocab_size ",
                 cfg.model.vocab_size, ")"));
}

// parallel.ep_overlap runs an attention's weight gradients under the layer below's exchange:
// it needs an exchange, a backward that computes them with the inputs' (not a zero-bubble
// schedule's B and W, which run apart already), what they read kept (not full recompute, which
// rebuilds each layer into one scratch) and weights of the model's own (not adapters).
void check_ep_overlap(const Config& cfg, const Origins& origins) {
    const ParallelConfig& p = cfg.parallel;
    if (!p.ep_overlap) return;
    const std::string_view what =
        "parallel.ep_overlap: true (the attention weight gradients "
        "of the layer above under each MoE layer's dispatch)";
    if (p.expert == 1)
        fail(origins.blame({"parallel.ep_overlap", "parallel.expert"}),
             cat(what, " needs parallel.expert > 1: without expert parallelism nothing travels"));
    if (pipeline::splits_backward(p.schedule))
        fail(origins.blame({"parallel.ep_overlap", "parallel.schedule"}),
             cat(what, " with parallel.schedule: ", enum_name(p.schedule),
                 " is not built: a zero-bubble schedule runs every weight gradient apart already"));
    if (cfg.training.recompute == Recompute::full)
        fail(origins.blame({"parallel.ep_overlap", "training.recompute"}),
             cat(what,
                 " with training.recompute: full is not built: the layer below's rerun "
                 "rebuilds its activations where the attention's wait"));
    if (cfg.training.lora.enabled())
        fail(origins.blame({"parallel.ep_overlap", "training.lora.rank"}),
             cat(what,
                 " with training.lora is not built: the adapters' weight gradients "
                 "run with their layer's backward"));
}

void validate(const Config& cfg, const Origins& origins, Purpose purpose) {
    check_required(origins, purpose);
    check_ranges(cfg, origins);
    if (purpose != Purpose::plan) refuse_unsupported_features(cfg, origins);
    check_model_and_batches(cfg, origins);
    check_moe(cfg, origins);
    check_expert_parallel(cfg, origins);
    check_tensor_and_context(cfg, origins);
    check_pipeline(cfg, origins);
    check_zero_and_lora(cfg, origins);
    check_architecture(cfg, origins);
    check_offload(cfg, origins);
    check_optimizer(cfg, origins);
    check_documents(cfg, origins);
    check_ep_overlap(cfg, origins);
    // Training adapters adapts given weights (over a random model they would adapt nothing);
    // bench and plan measure and model the run without them.
    if (purpose == Purpose::train && cfg.training.lora.enabled() && !cfg.model.init_from)
        fail(origins.blame({"training.lora.rank", "model.init_from"}),
             "training.lora.rank > 0 adapts given weights: set model.init_from (Hugging Face "
             "GPT-2 safetensors, or a checkpoint to fine-tune)");
}

}  // namespace trident::config::detail
