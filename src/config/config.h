// The one typed configuration of a run: what users write in YAML (the keys README lists with
// their defaults), checked up front, plus the values derived from it, computed once in `derive`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/error.h"
#include "model/buffer_spec.h"
#include "model/dims.h"
#include "model/moe_settings.h"
#include "model/param_layout.h"
#include "pipeline/schedule.h"

namespace trident::config {

// A bad config: the message names the file and line (or the --set override) and the key path,
// e.g. "configs/x.yaml:12: training.lr: expected a number, got "fast"".
class ConfigError : public trident::Error {
public:
    using trident::Error::Error;
};

// The model's and the pipeline's own enums, parsed straight from their YAML names: the
// schedule (pipeline::Kind), how attention sees the whole sequence when it is split over C
// ranks (ring attention, or DeepSpeed-Ulysses' all-to-alls), activation recompute, and the
// linears LoRA can adapt.
using model::Arch;
using model::ContextMode;
using model::LoraTarget;
using model::MoeRouter;
using model::MoeSettings;
using model::Recompute;
enum class Decay { cosine, linear, constant };
enum class NonFinite { stop, skip };  // what a bf16 or fp32 step with inf/NaN gradients does
enum class DeviceKind { auto_, cpu, cuda };
enum class DataFormat { auto_, llmc, megatron };  // auto: decided per path (data/dataset.h)
// data.documents: each window one causal sequence across document boundaries (stream), or
// attention within documents and positions per document (mask; model/documents.h).
enum class DocumentMode { stream, mask };
// training.loss_normalization: the mean of the microbatches' means, or the sum of the counted
// losses over the counted tokens of the whole global batch (Megatron's calculate_per_token_loss).
enum class LossNormalization { microbatch, tokens };
// What a failed write of a checkpoint, the metrics or the trace does: end the run cleanly (every
// rank, exit code 1) or report it and go on (a checkpoint is tried again at the next interval).
enum class OnError { stop, continue_ };
// Where this rank's optimizer state (fp32 master weights, Adam's m and v) lives: in device
// memory, in host memory, or in a file streamed chunk by chunk (optim/offload_store.h).
enum class Offload { none, host, nvme };
// The optimizer (optim/optimizer.h): AdamW for every parameter, or a matrix optimizer for the
// layers' weight matrices (AdamW for the rest).
enum class OptimizerName { adamw, muon, galore };
// Muon's factor on the orthogonalized update (optim/muon.h): Moonlight's 0.2·√max(A, B), or
// the spectral √max(1, A/B).
enum class MuonScale { moonlight, spectral };
enum class MuonNsDtype { fp32, bf16 };
// How a LoRA run holds its frozen base's layer matrices: as they are, or in QLoRA's 4-bit
// NormalFloat (model/nf4_base.h).
enum class LoraQuantize { none, nf4 };

// How the layers are cut into the P·v pipeline chunks: equal counts, counts that balance the
// chunks' FLOPs (the LM head and the loss weigh on the last chunk; src/config/stage_cuts.h), or
// the counts given, one per global chunk in order.
enum class StageCut { uniform, auto_, given };
struct StageLayers {
    StageCut cut = StageCut::auto_;
    std::vector<int> layers;  // given: layers of each global chunk
    bool operator==(const StageLayers&) const = default;
};

// The largest size each key may take: far beyond any model trained, and small enough that
// every product of them that the code forms (padded vocabulary, seq_len + 1, hidden × ffn,
// tensor descriptors per layer) is exact in 64 bits and each factor fits an int. A value past
// one is refused at load, before anything is built; checkpoint manifests are held to them too.
namespace limits {
inline constexpr int kVocab = 1 << 24;          // model.vocab_size
inline constexpr int kSeqLen = 1 << 20;         // model.seq_len
inline constexpr int kLayers = 1 << 12;         // model.layers
inline constexpr int kHidden = 1 << 17;         // model.hidden, model.ffn_hidden / 8
inline constexpr int kFfn = 1 << 20;            // model.ffn_hidden
inline constexpr int kRanks = 1 << 16;          // each of parallel.pipeline, tensor, data, context
inline constexpr int kVirtualStages = 1 << 12;  // parallel.virtual_stages
inline constexpr int kBatch = 1 << 24;          // training.micro_batch, training.global_batch
}  // namespace limits

struct ModelConfig {
    Arch arch = Arch::gpt2;
    int vocab_size = 50257;
    int seq_len = 1024;
    int layers = 12;
    int hidden = 768;
    int heads = 12;
    // When not given (load.cpp): gpt2 4 x hidden (3072 for the default 768); llama 8h/3 rounded
    // up to a multiple of 256.
    int ffn_hidden = 3072;
    int kv_heads = 12;            // when not given: heads
    int head_dim = 0;             // each head's width (llama); 0 (when not given): hidden / heads
    double rope_theta = 10000.0;  // llama's rotary base θ
    double norm_eps = 1e-5;       // llama's RMSNorm; GPT-2's LayerNorm has 1e-5 fixed
    bool qk_norm = false;         // Qwen3's RMSNorm of each query and key head (llama)
    // The MLP's kind, one registered in model/part_registry.cpp; when not given: gelu for
    // gpt2, swiglu for llama.
    std::string mlp = "gelu";
    bool tie_embeddings = true;  // when not given: gpt2 true (always), llama false
    MoeSettings moe;             // llama only; experts 0 (the default): dense
    double dropout = 0.0;
    double init_std = 0.02;
    // Hugging Face safetensors, a Hugging Face folder (its config.json fills the shape keys
    // left out: hf_folder.cpp) or a checkpoint
    std::optional<std::string> init_from;
    bool operator==(const ModelConfig&) const = default;
};

struct ParallelConfig {
    int pipeline = 1;  // P
    int tensor = 1;    // M
    int data = 1;      // D
    int context = 1;   // C: each sequence's tokens split over C ranks
    ContextMode context_mode = ContextMode::ring;
    int virtual_stages = 1;
    pipeline::Kind schedule = pipeline::Kind::one_f_one_b;
    int zero_stage = 1;          // 0 .. 3 (optim/adamw.h)
    int bucket_size = 16777216;  // parameters per gradient bucket of the data-parallel reduction
    bool sequence_parallel = false;
    // Under sequence parallelism: each split linear's all-gather and reduce-scatter cut into M
    // pieces that move while the GEMM's pieces compute (model/tensor_rows.h).
    bool tp_overlap = false;
    // Under expert parallelism: the attention weight gradients of the layer above each MoE
    // layer computed while that layer's backward dispatch travels (model/moe_mlp.cpp).
    bool ep_overlap = false;
    StageLayers stage_layers;
    // The reductions under the backward pass, the all-gathers under the next forward
    // (zero_stage 3: each unit's gather under the previous unit's compute; optim/adamw.h).
    bool overlap_grad_reduce = true;
    bool overlap_param_gather = true;
    // zero_stage 2 and 3 with several microbatches: reduce-scatter every microbatch's
    // gradients into the shard (true), or keep them whole until the step's last (false).
    bool sharded_accumulation = true;
    // zero_stage 3: release a unit's gathered parameters after each forward and backward that
    // reads them (true: 2 gathers per unit and microbatch), or keep them from the unit's first
    // gather of the step until the step's backward has ended (false: one gather per unit and
    // step, the stage's whole parameters resident meanwhile). PyTorch FSDP2's option.
    bool reshard_after_forward = true;
    // Hybrid sharding: ZeRO shards over runs of this many ranks of the D·C data-context group
    // and replicates across the runs (parallel/grid.h); 0: over all D·C.
    int data_shard = 0;
    // The ranks ZeRO shards over: data_shard, or all D·C.
    int shard_ranks() const { return data_shard == 0 ? data * context : data_shard; }
    // Expert parallelism: the experts of every MoE layer split over this many consecutive
    // ranks of the data-context group (parallel/grid.h); 1: every rank computes every expert.
    int expert = 1;
    // The ranks the experts held are sharded over (the expert-shard group): of the D·C/E
    // holding the same experts, those within one shard group, N/E (E divides N).
    int expert_shard_ranks() const { return shard_ranks() / expert; }
    bool operator==(const ParallelConfig&) const = default;
};

// Low-rank adapters (Hu et al., "LoRA", 2021): each target W of every layer becomes
// W + (alpha / rank) · B · A with A (rank, in) and B (out, rank) trained and W frozen.
struct LoraConfig {
    int rank = 0;  // r; 0: no adapters, every parameter trains
    double alpha = 16.0;
    double dropout = 0.0;  // on the adapter's input, before A
    std::vector<LoraTarget> targets = {LoraTarget::qkv, LoraTarget::attn_proj, LoraTarget::fc,
                                       LoraTarget::fc_proj};
    // The adapters' starting values (safetensors, model/lora.h names); none: A
    // Kaiming-uniform from training.seed, B zero.
    std::optional<std::string> init_from;
    LoraQuantize quantize = LoraQuantize::none;
    int quant_block = 64;      // elements per absmax (nf4)
    bool double_quant = true;  // the absmax values in 8 bits (nf4)
    bool enabled() const { return rank > 0; }
    bool quantized() const { return quantize != LoraQuantize::none; }
    bool operator==(const LoraConfig&) const = default;
};

// Updates skipped as outliers (llm.c's rule): a step whose loss or gradient norm lies more
// than `zscore` standard deviations above the mean of the last `window` applied steps'.
struct SkipSpikes {
    double zscore = 0;  // 0: off
    int window = 100;
    bool enabled() const { return zscore > 0; }
    bool operator==(const SkipSpikes&) const = default;
};

struct TrainingConfig {
    int micro_batch = 4;    // sequences per microbatch
    int global_batch = 32;  // sequences per step
    int steps = 1000;
    double lr = 6.0e-4;
    double min_lr = 6.0e-5;
    int warmup_steps = 100;
    Decay decay = Decay::cosine;
    double weight_decay = 0.1;
    double beta1 = 0.9;
    double beta2 = 0.95;
    double eps = 1.0e-8;
    double grad_clip = 1.0;                          // 0 disables clipping
    kernels::DType precision = kernels::DType::f32;  // a compute type: fp32, bf16 or fp16
    // 16-bit precisions: accumulate gradients over microbatches and reduce them over the
    // data-parallel group in fp32 (4 bytes per parameter instead of 2). When not given: true
    // under bf16, false otherwise (load.cpp).
    bool fp32_grad_accumulation = false;
    // fp32 matrix products on a GPU's tensor cores in TF32 (10-bit mantissa inputs, fp32
    // accumulation), as PyTorch's allow_tf32; false keeps them in true fp32. The CPU ignores it.
    bool tf32 = true;
    // fp16's dynamic loss scale: the start, the clean steps before it doubles, its floor.
    double loss_scale = 65536.0;
    int loss_scale_window = 1000;
    double min_loss_scale = 1.0;
    NonFinite nonfinite = NonFinite::stop;  // fp16 always skips (and halves the scale)
    SkipSpikes skip_spikes;
    int max_skipped = 10;    // consecutive skipped updates (not fp16's) that stop the run; 0: any
    int check_replicas = 0;  // steps between comparisons of the replicas' weights; 0: never
    // A rank whose time outside communication exceeds the median rank's by this factor is
    // named every logging.interval steps; 0: not checked.
    double straggler_factor = 0;
    Recompute recompute = Recompute::none;
    LossNormalization loss_normalization = LossNormalization::microbatch;
    uint64_t seed = 1234;
    int threads = 0;  // CPU threads for ops, OpenBLAS and offload: host's update; 0 = all cores
    int eval_interval = 0;  // steps between validation passes; 0 = only after the last step
    // Sequences of data.valid per validation pass: samples 0 .. eval_sequences - 1, split over
    // the data-parallel replicas in microbatches, so every layout evaluates the same tokens.
    // When not given: global_batch (load.cpp).
    int eval_sequences = 32;
    // The old spelling, counting microbatches: load.cpp reads it as eval_sequences =
    // eval_batches × micro_batch (with a warning) and leaves it 0.
    int eval_batches = 0;
    // The stall watchdog (parallel/watchdog.h): seconds a rank may wait in one communication
    // call before the job is aborted (0: no watchdog), and the longer allowances until the
    // first step has completed and during a checkpoint's save or load.
    double collective_timeout = 600;
    double collective_timeout_first_step = 1800;
    double collective_timeout_checkpoint = 1800;
    LoraConfig lora;
    bool operator==(const TrainingConfig&) const = default;
};

// One dataset of data.train or data.valid: llm.c shards (a path or a glob) or a Megatron
// indexed dataset (PREFIX, PREFIX.bin or PREFIX.idx), and its weight in the blend as written
// (> 0; the blend normalises the weights to sum to 1).
struct DataSource {
    std::string path;
    double weight = 1.0;
    bool operator==(const DataSource&) const = default;
};

struct DataConfig {
    std::vector<DataSource> train;  // one dataset (a plain path in YAML), or a weighted blend
    std::vector<DataSource> valid;  // empty: none; separate data, never carved from train
    DataFormat format = DataFormat::auto_;
    bool shuffle = true;
    DocumentMode documents = DocumentMode::stream;
    // The token that ends a document: the family's (model::arch_defaults: GPT-2's
    // <|endoftext|>), or a llama's eos_token_id from its config.json (hf_folder.cpp).
    int eod_token = 0;
    bool mask_eod_loss = false;  // a position whose input is eod counts no loss
    bool operator==(const DataConfig&) const = default;
};

struct CheckpointConfig {
    std::optional<std::string> dir;
    int interval = 0;  // steps; 0 = only at the end
    int keep = 3;
    std::string resume = "auto";  // auto | never | PATH
    OnError on_error = OnError::stop;
    // Resume even though a training or validation file differs from what the checkpoint
    // recorded (its size or sampled SHA-256): a warning instead of an error.
    bool allow_data_change = false;
    // Each rank's share copied to host memory and written by a background thread while
    // training goes on; committed (the manifest) once every rank has written.
    bool async = false;
    // Resume even though training.seed or training.global_batch differ from the checkpoint's
    // run (which changes the samples each step draws): a warning instead of an error.
    bool allow_order_change = false;
    // Resume an AdamW run's checkpoint with another optimizer.name: the state the new one
    // keeps under names the checkpoint lacks starts from zero (said once), instead of an error.
    bool allow_optimizer_change = false;
    bool operator==(const CheckpointConfig&) const = default;
};

// optimizer.muon (Jordan et al. 2024; Liu et al. 2025): the momentum, Nesterov's form, the
// Newton-Schulz iterations, their products' precision and the update's scale.
struct MuonConfig {
    double momentum = 0.95;
    bool nesterov = true;
    int ns_steps = 5;
    MuonNsDtype ns_dtype = MuonNsDtype::fp32;
    MuonScale scale = MuonScale::moonlight;
    bool operator==(const MuonConfig&) const = default;
};

// optimizer.galore (Zhao et al. 2024): the projection's rank, the steps between projector
// updates and the factor on the projected-back update.
struct GaloreConfig {
    int rank = 128;
    int update_gap = 200;
    double scale = 0.25;
    bool operator==(const GaloreConfig&) const = default;
};

struct OptimizerConfig {
    OptimizerName name = OptimizerName::adamw;
    MuonConfig muon;
    GaloreConfig galore;
    Offload offload = Offload::none;
    std::optional<std::string> offload_dir;  // required for nvme: one state file per rank
    // Parameters per chunk of the streamed state: 3 host buffers of 12 bytes per parameter
    // each (read-ahead, update, write-behind) bound the resident memory the state takes.
    int offload_chunk = 1 << 20;
    // ZeRO-3's parameter shards off the device as well (ZeRO-Infinity): not built yet,
    // refused at start-up.
    bool offload_params = false;
    bool operator==(const OptimizerConfig&) const = default;
};

struct LoggingConfig {
    int interval = 1;
    // JSON-lines path. When not given: <checkpoint.dir>/metrics.jsonl, none without a
    // checkpoint.dir (load.cpp), so that each run's steps go to its own file.
    std::optional<std::string> metrics;
    std::optional<std::string> trace;        // Chrome trace path
    std::optional<std::string> tensorboard;  // directory of TensorBoard event files
    int trace_from = 2;                      // first traced step (1-based; the first warms up)
    int trace_steps = 1;                     // how many steps the trace covers
    int sample_tokens = 0;                   // tokens of text generated after training; 0 = none
    std::string sample_prompt;               // the sample's prompt; empty = start of a document
    OnError on_error = OnError::stop;        // a failed write of the metrics file or the trace
    bool operator==(const LoggingConfig&) const = default;
};

// What the machine can do, where the run cannot measure it well.
struct HardwareConfig {
    // FLOP/s per process that MFU is against; 0: a GPU's datasheet dense bf16 rate, else the
    // fp32 GEMM rate measured at start-up (train/device_peak.h).
    double peak_flops = 0;
    bool operator==(const HardwareConfig&) const = default;
};

// Values computed once from the rest.
struct Derived {
    int padded_vocab = 0;           // vocab_size rounded up to a multiple of 128 * tensor
    int head_dim = 0;               // model.head_dim, or hidden / heads
    int world_size = 0;             // pipeline * tensor * context * data
    int grad_accum_steps = 0;       // global_batch / (micro_batch * data)
    int64_t tokens_per_step = 0;    // global_batch * seq_len
    int64_t parameters = 0;         // unique parameters of the model, padded vocabulary excluded
    int64_t active_parameters = 0;  // of those, the ones a token computes with (a mixture of
                                    // experts: its top_k routed experts only)
    double flops_per_step = 0;      // Megatron's model FLOPs for one global batch (LoRA: fewer)
    std::vector<int> chunk_layers;  // layers of each global pipeline chunk (P·v), in order
    bool operator==(const Derived&) const = default;
};

struct Config {
    ModelConfig model;
    ParallelConfig parallel;
    TrainingConfig training;
    OptimizerConfig optimizer;
    DataConfig data;
    CheckpointConfig checkpoint;
    LoggingConfig logging;
    HardwareConfig hardware;
    DeviceKind device = DeviceKind::auto_;
    Derived derived;
    std::string source;  // the file it came from, for messages
    // What loading noticed but accepted (a deprecated key), for the command to print once.
    std::vector<std::string> warnings;
    // What loading settled without fault (an override taking a deprecated key's place), for
    // the command to print once as a note.
    std::vector<std::string> notes;
    bool operator==(const Config&) const = default;
};

// What a config is loaded for. `train` checks everything and refuses the settings this build
// cannot run yet (e.g. a GPU device on a CPU-only build). `bench` (steps timed on random
// tokens) reads no dataset, so it needs no data.train; otherwise it checks as train does.
// `plan` (memory and time estimates for any hardware) needs no data.train either and accepts
// what this build cannot run, checking everything else alike.
enum class Purpose { train, bench, plan };

// Loads `path`, applies each "key.path=value" override in order, validates, derives.
// Throws ConfigError naming the file line (or the override) and the key path.
Config load(const std::string& path, const std::vector<std::string>& overrides = {},
            Purpose purpose = Purpose::train);

// The same from YAML text (for tests and embedded defaults); `source` names it in messages.
Config parse(const std::string& yaml_text, const std::string& source,
             const std::vector<std::string>& overrides = {}, Purpose purpose = Purpose::train);

// Fills cfg.derived from the rest; called by load/parse.
void derive(Config& cfg);

// The config as YAML, every key written, so a run's exact settings can be saved beside it.
std::string to_yaml(const Config& cfg);

const char* to_string(Arch v);
const char* to_string(ContextMode v);
const char* to_string(Decay v);
const char* to_string(Recompute v);
const char* to_string(NonFinite v);
const char* to_string(DeviceKind v);
const char* to_string(DataFormat v);
const char* to_string(DocumentMode v);
const char* to_string(LossNormalization v);
const char* to_string(OnError v);
const char* to_string(Offload v);
const char* to_string(OptimizerName v);
const char* to_string(LoraTarget v);
const char* to_string(LoraQuantize v);
std::string to_string(const StageLayers& v);  // as YAML: uniform, auto or [n0, n1, ...]
// The grid as `train`, `plan` and `checkpoint info` print it: "2 x 4 x 1 x 8 (pipeline x
// tensor x context x data) = 64 ranks".
std::string layout_text(int pipeline, int tensor, int context, int data);

}  // namespace trident::config
