// The table of config keys: every key a user can write, with its range. One row per key;
// loading, validation and to_yaml walk this table (see schema.h).
//
// Limits that involve two keys at once (hidden divisible by heads, the global batch a
// multiple of micro_batch x data, ...) live in validate.cpp.
#include "config/schema.h"

#include <algorithm>
#include <type_traits>

#include "io/user_paths.h"
#include "model/model_spec.h"

namespace trident::config::detail {
namespace {

template <typename T>
using RangeCheck = std::function<Problem(const T&)>;

std::string text(int v) {
    return std::to_string(v);
}
std::string text(double v) {
    return format_number(v);
}

// A path a system call can take (io/user_paths.h): a longer one (a pasted file) is refused
// as the config is read, shown cut, rather than echoed whole in an error of the file system.
Problem path_problem(const std::string& path) {
    if (std::string problem = io::path_problem(path); !problem.empty()) return problem;
    return {};
}

// A key stored at cfg.*section.*member, e.g. field("model.layers", &Config::model,
// &ModelConfig::layers, between(1, limits::kLayers)).
template <typename Section, typename T>
Key field(std::string_view path, Section Config::*section, T Section::*member,
          std::type_identity_t<RangeCheck<T>> range = nullptr) {
    return Key{
        .path = path,
        .read = [=](Config& c, const YAML::Node& node,
                    YAML::Mark&) { return read_value(node, (c.*section).*member); },
        .write = [=](const Config& c) { return yaml_text((c.*section).*member); },
        .check_range =
            [=](const Config& c) { return range ? range((c.*section).*member) : Problem{}; },
    };
}

// A key outside any section, stored at cfg.*member.
template <typename T>
Key field(std::string_view path, T Config::*member,
          std::type_identity_t<RangeCheck<T>> range = nullptr) {
    return Key{
        .path = path,
        .read = [=](Config& c, const YAML::Node& node,
                    YAML::Mark&) { return read_value(node, c.*member); },
        .write = [=](const Config& c) { return yaml_text(c.*member); },
        .check_range = [=](const Config& c) { return range ? range(c.*member) : Problem{}; },
    };
}

// A dataset key of the data section: a path, or a list of {path, weight} (values.h);
// `nullable` keys also take null for none. Items are checked as they are read.
Key sources(std::string_view path, std::vector<DataSource> DataConfig::*member, bool nullable) {
    return Key{
        .path = path,
        .read = [=](Config& c, const YAML::Node& node,
                    YAML::Mark& at) { return read_sources(node, c.data.*member, nullable, at); },
        .write = [=](const Config& c) { return yaml_text(c.data.*member); },
        .check_range =
            [=](const Config& c) {
                for (const DataSource& source : c.data.*member)
                    if (Problem p = path_problem(source.path)) return p;
                return Problem{};
            },
    };
}

// The section a map's parts live in: model (moe), training (lora, skip_spikes) or optimizer
// (muon, galore).
ModelConfig& section(Config& c, ModelConfig*) {
    return c.model;
}
const ModelConfig& section(const Config& c, ModelConfig*) {
    return c.model;
}
TrainingConfig& section(Config& c, TrainingConfig*) {
    return c.training;
}
OptimizerConfig& section(Config& c, OptimizerConfig*) {
    return c.optimizer;
}
const TrainingConfig& section(const Config& c, TrainingConfig*) {
    return c.training;
}
const OptimizerConfig& section(const Config& c, OptimizerConfig*) {
    return c.optimizer;
}

// A part of a key whose value is a map (training.lora, optimizer.muon), stored at the
// section's map.*member and range-checked as it is read (the parts' limits do not depend on
// each other).
template <typename Section, typename Map, typename T>
Part part(std::string_view name, Map Section::*map, T Map::*member,
          std::type_identity_t<RangeCheck<T>> range = nullptr) {
    return Part{
        .name = name,
        .read = [=](Config& c, const YAML::Node& node, YAML::Mark&) -> Problem {
            Map& parts = section(c, static_cast<Section*>(nullptr)).*map;
            T value = parts.*member;
            if (Problem p = read_value(node, value)) return p;
            if (Problem p = range ? range(value) : Problem{}) return p;
            parts.*member = value;
            return {};
        },
        .write =
            [=](const Config& c) {
                return yaml_text(section(c, static_cast<Section*>(nullptr)).*map.*member);
            },
    };
}

// SECTION.PATH: a map of settings, written back as one flow map.
template <typename Section, typename Map>
Key map(std::string_view path, Map Section::*member, std::vector<Part> parts) {
    return Key{
        .path = path,
        .write =
            [parts](const Config& c) {
                std::string out = "{";
                for (const Part& part : parts)
                    out += (out.size() > 1 ? ", " : "") + std::string(part.name) + ": " +
                           part.write(c);
                return out + "}";
            },
        .check_range = [](const Config&) { return Problem{}; },
        .parts = std::move(parts),
        .reset =
            [member](Config& c) { section(c, static_cast<Section*>(nullptr)).*member = Map{}; },
    };
}

Key required(Key key) {
    key.required = true;
    return key;
}

Key deprecated(Key key) {
    key.deprecated = true;
    return key;
}

// Range checks.

template <typename T>
RangeCheck<T> at_least(T min) {
    return [min](const T& v) -> Problem {
        if (v >= min) return {};
        return "must be >= " + text(min) + ", got " + text(v);
    };
}

// Sizes: at least `min`, at most `max` (config.h's limits).
RangeCheck<int> between(int min, int max) {
    return [min, max](const int& v) -> Problem {
        if (v >= min && v <= max) return {};
        return "must be in [" + text(min) + ", " + text(max) + "], got " + text(v);
    };
}

// A power of two in [min, max].
RangeCheck<int> power_of_two(int min, int max) {
    return [min, max](const int& v) -> Problem {
        if (v >= min && v <= max && (v & (v - 1)) == 0) return {};
        return "must be a power of two in [" + text(min) + ", " + text(max) + "], got " + text(v);
    };
}

RangeCheck<double> above(double min) {
    return [min](const double& v) -> Problem {
        if (v > min) return {};
        return "must be > " + text(min) + ", got " + text(v);
    };
}

// 0 (off), or above `min`: a factor that only means something past it.
RangeCheck<double> off_or_above(double min) {
    return [min](const double& v) -> Problem {
        if (v == 0 || v > min) return {};
        return "must be 0 (off) or > " + text(min) + ", got " + text(v);
    };
}

// [0, 1): dropout probabilities and Adam's betas.
RangeCheck<double> fraction() {
    return [](const double& v) -> Problem {
        if (v >= 0 && v < 1) return {};
        return "must be in [0, 1), got " + text(v);
    };
}

// A ZeRO stage (Rajbhandari et al.): 0 plain data parallelism, 1 optimizer state sharded,
// 2 gradients too, 3 parameters too.
RangeCheck<int> zero_stage() {
    return [](const int& v) -> Problem {
        if (v >= 0 && v <= 3) return {};
        return "must be 0, 1, 2 or 3, got " + text(v);
    };
}

RangeCheck<std::optional<std::string>> a_path() {
    return [](const std::optional<std::string>& v) -> Problem {
        return v ? path_problem(*v) : Problem{};
    };
}

// checkpoint.resume: auto, never or a path.
RangeCheck<std::string> resume_choice() {
    return [](const std::string& v) -> Problem {
        if (v.empty()) return "must not be empty";
        return v == "auto" || v == "never" ? Problem{} : path_problem(v);
    };
}

// A kind of MLP the model knows (model/model_spec.h).
RangeCheck<std::string> mlp_kind() {
    return [](const std::string& v) -> Problem {
        if (model::is_mlp(v)) return {};
        std::string names;
        for (const std::string& n : model::mlp_names()) names += (names.empty() ? "" : ", ") + n;
        return "must be one of " + names + ", got \"" + v + "\"";
    };
}

const std::vector<Key>& table() {
    using C = Config;
    static const std::vector<Key> rows = {
        field("model.arch", &C::model, &ModelConfig::arch),
        field("model.vocab_size", &C::model, &ModelConfig::vocab_size, between(2, limits::kVocab)),
        field("model.seq_len", &C::model, &ModelConfig::seq_len, between(1, limits::kSeqLen)),
        field("model.layers", &C::model, &ModelConfig::layers, between(1, limits::kLayers)),
        field("model.hidden", &C::model, &ModelConfig::hidden, between(1, limits::kHidden)),
        field("model.heads", &C::model, &ModelConfig::heads, between(1, limits::kHidden)),
        field("model.ffn_hidden", &C::model, &ModelConfig::ffn_hidden, between(1, limits::kFfn)),
        field("model.kv_heads", &C::model, &ModelConfig::kv_heads, between(1, limits::kHidden)),
        field("model.rope_theta", &C::model, &ModelConfig::rope_theta, above(0.0)),
        field("model.norm_eps", &C::model, &ModelConfig::norm_eps, above(0.0)),
        field("model.mlp", &C::model, &ModelConfig::mlp, mlp_kind()),
        field("model.tie_embeddings", &C::model, &ModelConfig::tie_embeddings),
        field("model.qk_norm", &C::model, &ModelConfig::qk_norm),
        field("model.head_dim", &C::model, &ModelConfig::head_dim, between(0, limits::kHidden)),
        map("model.moe", &ModelConfig::moe,
            {
                part("experts", &ModelConfig::moe, &MoeSettings::experts, between(0, 4096)),
                part("top_k", &ModelConfig::moe, &MoeSettings::top_k, at_least(1)),
                part("ffn_hidden", &ModelConfig::moe, &MoeSettings::ffn_hidden,
                     between(0, limits::kFfn)),
                part("shared_experts", &ModelConfig::moe, &MoeSettings::shared_experts,
                     between(0, 64)),
                part("router", &ModelConfig::moe, &MoeSettings::router),
                part("normalize_top_k", &ModelConfig::moe, &MoeSettings::normalize_top_k),
                part("scale", &ModelConfig::moe, &MoeSettings::scale, above(0.0)),
                part("aux_loss", &ModelConfig::moe, &MoeSettings::aux_loss, at_least(0.0)),
                part("z_loss", &ModelConfig::moe, &MoeSettings::z_loss, at_least(0.0)),
                part("bias_update_rate", &ModelConfig::moe, &MoeSettings::bias_update_rate,
                     at_least(0.0)),
                part("first_dense", &ModelConfig::moe, &MoeSettings::first_dense, at_least(0)),
                part("every", &ModelConfig::moe, &MoeSettings::every, at_least(1)),
                part("capacity_factor", &ModelConfig::moe, &MoeSettings::capacity_factor,
                     at_least(0.0)),
            }),
        field("model.dropout", &C::model, &ModelConfig::dropout, fraction()),
        field("model.init_std", &C::model, &ModelConfig::init_std, above(0.0)),
        field("model.init_from", &C::model, &ModelConfig::init_from, a_path()),

        field("parallel.pipeline", &C::parallel, &ParallelConfig::pipeline,
              between(1, limits::kRanks)),
        field("parallel.tensor", &C::parallel, &ParallelConfig::tensor, between(1, limits::kRanks)),
        field("parallel.data", &C::parallel, &ParallelConfig::data, between(1, limits::kRanks)),
        field("parallel.context", &C::parallel, &ParallelConfig::context,
              between(1, limits::kRanks)),
        field("parallel.context_mode", &C::parallel, &ParallelConfig::context_mode),
        field("parallel.virtual_stages", &C::parallel, &ParallelConfig::virtual_stages,
              between(1, limits::kVirtualStages)),
        field("parallel.schedule", &C::parallel, &ParallelConfig::schedule),
        field("parallel.zero_stage", &C::parallel, &ParallelConfig::zero_stage, zero_stage()),
        field("parallel.bucket_size", &C::parallel, &ParallelConfig::bucket_size, at_least(1)),
        field("parallel.sequence_parallel", &C::parallel, &ParallelConfig::sequence_parallel),
        field("parallel.tp_overlap", &C::parallel, &ParallelConfig::tp_overlap),
        field("parallel.ep_overlap", &C::parallel, &ParallelConfig::ep_overlap),
        field("parallel.stage_layers", &C::parallel, &ParallelConfig::stage_layers),
        field("parallel.overlap_grad_reduce", &C::parallel, &ParallelConfig::overlap_grad_reduce),
        field("parallel.overlap_param_gather", &C::parallel, &ParallelConfig::overlap_param_gather),
        field("parallel.sharded_accumulation", &C::parallel, &ParallelConfig::sharded_accumulation),
        field("parallel.reshard_after_forward", &C::parallel,
              &ParallelConfig::reshard_after_forward),
        field("parallel.data_shard", &C::parallel, &ParallelConfig::data_shard,
              between(0, limits::kRanks)),
        field("parallel.expert", &C::parallel, &ParallelConfig::expert, between(1, limits::kRanks)),

        field("training.micro_batch", &C::training, &TrainingConfig::micro_batch,
              between(1, limits::kBatch)),
        field("training.global_batch", &C::training, &TrainingConfig::global_batch,
              between(1, limits::kBatch)),
        field("training.steps", &C::training, &TrainingConfig::steps, at_least(1)),
        field("training.lr", &C::training, &TrainingConfig::lr, above(0.0)),
        field("training.min_lr", &C::training, &TrainingConfig::min_lr, at_least(0.0)),
        field("training.warmup_steps", &C::training, &TrainingConfig::warmup_steps, at_least(0)),
        field("training.decay", &C::training, &TrainingConfig::decay),
        field("training.weight_decay", &C::training, &TrainingConfig::weight_decay, at_least(0.0)),
        field("training.beta1", &C::training, &TrainingConfig::beta1, fraction()),
        field("training.beta2", &C::training, &TrainingConfig::beta2, fraction()),
        field("training.eps", &C::training, &TrainingConfig::eps, above(0.0)),
        field("training.grad_clip", &C::training, &TrainingConfig::grad_clip, at_least(0.0)),
        field("training.precision", &C::training, &TrainingConfig::precision),
        field("training.fp32_grad_accumulation", &C::training,
              &TrainingConfig::fp32_grad_accumulation),
        field("training.tf32", &C::training, &TrainingConfig::tf32),
        field("training.loss_scale", &C::training, &TrainingConfig::loss_scale, above(0.0)),
        field("training.loss_scale_window", &C::training, &TrainingConfig::loss_scale_window,
              at_least(1)),
        field("training.min_loss_scale", &C::training, &TrainingConfig::min_loss_scale, above(0.0)),
        field("training.nonfinite", &C::training, &TrainingConfig::nonfinite),
        field("training.recompute", &C::training, &TrainingConfig::recompute),
        field("training.loss_normalization", &C::training, &TrainingConfig::loss_normalization),
        field("training.seed", &C::training, &TrainingConfig::seed),
        field("training.threads", &C::training, &TrainingConfig::threads, at_least(0)),
        field("training.eval_interval", &C::training, &TrainingConfig::eval_interval, at_least(0)),
        field("training.eval_sequences", &C::training, &TrainingConfig::eval_sequences,
              at_least(1)),
        // Range-checked as load.cpp maps it onto training.eval_sequences.
        deprecated(field("training.eval_batches", &C::training, &TrainingConfig::eval_batches)),
        field("training.collective_timeout", &C::training, &TrainingConfig::collective_timeout,
              at_least(0.0)),
        field("training.collective_timeout_first_step", &C::training,
              &TrainingConfig::collective_timeout_first_step, at_least(0.0)),
        field("training.collective_timeout_checkpoint", &C::training,
              &TrainingConfig::collective_timeout_checkpoint, at_least(0.0)),
        field("training.max_skipped", &C::training, &TrainingConfig::max_skipped, at_least(0)),
        map("training.skip_spikes", &TrainingConfig::skip_spikes,
            {
                part("zscore", &TrainingConfig::skip_spikes, &SkipSpikes::zscore, at_least(0.0)),
                part("window", &TrainingConfig::skip_spikes, &SkipSpikes::window, at_least(2)),
            }),
        field("training.check_replicas", &C::training, &TrainingConfig::check_replicas,
              at_least(0)),
        field("training.straggler_factor", &C::training, &TrainingConfig::straggler_factor,
              off_or_above(1.0)),
        map("training.lora", &TrainingConfig::lora,
            {
                part("rank", &TrainingConfig::lora, &LoraConfig::rank, at_least(0)),
                part("alpha", &TrainingConfig::lora, &LoraConfig::alpha, above(0.0)),
                part("dropout", &TrainingConfig::lora, &LoraConfig::dropout, fraction()),
                Part{
                    .name = "targets",
                    .read =
                        [](Config& c, const YAML::Node& node, YAML::Mark& at) {
                            return read_value(node, c.training.lora.targets, at);
                        },
                    .write = [](const Config& c) { return yaml_text(c.training.lora.targets); },
                },
                part("init_from", &TrainingConfig::lora, &LoraConfig::init_from, a_path()),
                part("quantize", &TrainingConfig::lora, &LoraConfig::quantize),
                part("quant_block", &TrainingConfig::lora, &LoraConfig::quant_block,
                     power_of_two(16, 4096)),
                part("double_quant", &TrainingConfig::lora, &LoraConfig::double_quant),
            }),

        field("optimizer.name", &C::optimizer, &OptimizerConfig::name),
        map("optimizer.muon", &OptimizerConfig::muon,
            {
                part("momentum", &OptimizerConfig::muon, &MuonConfig::momentum, fraction()),
                part("nesterov", &OptimizerConfig::muon, &MuonConfig::nesterov),
                part("ns_steps", &OptimizerConfig::muon, &MuonConfig::ns_steps, at_least(1)),
                part("ns_dtype", &OptimizerConfig::muon, &MuonConfig::ns_dtype),
                part("scale", &OptimizerConfig::muon, &MuonConfig::scale),
            }),
        map("optimizer.galore", &OptimizerConfig::galore,
            {
                part("rank", &OptimizerConfig::galore, &GaloreConfig::rank, at_least(1)),
                part("update_gap", &OptimizerConfig::galore, &GaloreConfig::update_gap,
                     at_least(1)),
                part("scale", &OptimizerConfig::galore, &GaloreConfig::scale, above(0.0)),
            }),
        field("optimizer.offload", &C::optimizer, &OptimizerConfig::offload),
        field("optimizer.offload_dir", &C::optimizer, &OptimizerConfig::offload_dir, a_path()),
        field("optimizer.offload_chunk", &C::optimizer, &OptimizerConfig::offload_chunk,
              at_least(1)),
        field("optimizer.offload_params", &C::optimizer, &OptimizerConfig::offload_params),

        required(sources("data.train", &DataConfig::train, false)),
        sources("data.valid", &DataConfig::valid, true),
        field("data.format", &C::data, &DataConfig::format),
        field("data.shuffle", &C::data, &DataConfig::shuffle),
        field("data.documents", &C::data, &DataConfig::documents),
        field("data.eod_token", &C::data, &DataConfig::eod_token, at_least(0)),
        field("data.mask_eod_loss", &C::data, &DataConfig::mask_eod_loss),

        field("checkpoint.dir", &C::checkpoint, &CheckpointConfig::dir, a_path()),
        field("checkpoint.interval", &C::checkpoint, &CheckpointConfig::interval, at_least(0)),
        field("checkpoint.keep", &C::checkpoint, &CheckpointConfig::keep, at_least(1)),
        field("checkpoint.resume", &C::checkpoint, &CheckpointConfig::resume, resume_choice()),
        field("checkpoint.on_error", &C::checkpoint, &CheckpointConfig::on_error),
        field("checkpoint.allow_data_change", &C::checkpoint, &CheckpointConfig::allow_data_change),
        field("checkpoint.async", &C::checkpoint, &CheckpointConfig::async),
        field("checkpoint.allow_order_change", &C::checkpoint,
              &CheckpointConfig::allow_order_change),
        field("checkpoint.allow_optimizer_change", &C::checkpoint,
              &CheckpointConfig::allow_optimizer_change),

        field("logging.interval", &C::logging, &LoggingConfig::interval, at_least(1)),
        field("logging.metrics", &C::logging, &LoggingConfig::metrics, a_path()),
        field("logging.trace", &C::logging, &LoggingConfig::trace, a_path()),
        field("logging.tensorboard", &C::logging, &LoggingConfig::tensorboard, a_path()),
        field("logging.trace_from", &C::logging, &LoggingConfig::trace_from, at_least(1)),
        field("logging.trace_steps", &C::logging, &LoggingConfig::trace_steps, at_least(1)),
        field("logging.sample_tokens", &C::logging, &LoggingConfig::sample_tokens, at_least(0)),
        field("logging.sample_prompt", &C::logging, &LoggingConfig::sample_prompt),
        field("logging.on_error", &C::logging, &LoggingConfig::on_error),

        field("hardware.peak_flops", &C::hardware, &HardwareConfig::peak_flops, at_least(0.0)),

        field("device", &C::device),
    };
    return rows;
}

}  // namespace

std::span<const Key> keys() {
    return table();
}

const Key* find_key(std::string_view path) {
    for (const Key& key : table())
        if (key.path == path) return &key;
    return nullptr;
}

const Part* find_part(const Key& key, std::string_view name) {
    for (const Part& part : key.parts)
        if (part.name == name) return &part;
    return nullptr;
}

std::vector<std::string> sections() {
    std::vector<std::string> names;
    for (const Key& key : table()) {
        std::string section(section_of(key.path));
        if (!section.empty() && std::find(names.begin(), names.end(), section) == names.end())
            names.push_back(section);
    }
    return names;
}

std::string_view section_of(std::string_view path) {
    size_t dot = path.find('.');
    return dot == std::string_view::npos ? std::string_view() : path.substr(0, dot);
}

std::string_view leaf_of(std::string_view path) {
    size_t dot = path.find('.');
    return dot == std::string_view::npos ? path : path.substr(dot + 1);
}

}  // namespace trident::config::detail
