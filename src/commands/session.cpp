// Shared start-up of `train` and `bench` (see session.h).
#include "commands/session.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <new>
#include <string>
#include <vector>

#include "config/model_shape.h"
#include "kernels/error.h"
#include "kernels/threads.h"
#include "model/lora.h"
#include "model/param_layout.h"
#include "model/part_kinds.h"
#include "plan/memory_model.h"
#include "train/base_weights.h"
#include "train/device_peak.h"
#include "train/metrics.h"
#if TRIDENT_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.h"
#include "parallel/cuda/gpu_binding.h"
#include "parallel/cuda/nccl_comm.h"
#include "parallel/cuda/staged_comm.h"
#include "parallel/watchdog.h"
#endif

namespace trident::commands {

parallel::GridShape grid_shape(const config::Config& cfg) {
    const config::ParallelConfig& p = cfg.parallel;
    return parallel::GridShape{p.pipeline,
                               p.tensor,
                               p.data,
                               p.context,
                               model::kv_replicas(cfg.model.kv_heads, p.tensor),
                               pipeline::placement(p.schedule) == model::Placement::v_shape,
                               p.data_shard,
                               p.expert};
}

int run_on_every_rank(parallel::World& world, const std::function<void()>& set_up,
                      const std::function<void()>& run) {
    std::string error;
    try {
        set_up();
    } catch (const std::exception& e) {
        error = e.what();
    }
    if (parallel::any_rank_failed(world, !error.empty()))
        return parallel::report_failure(world, error, parallel::FailureKind::agreed);
    try {
        run();
    } catch (const EveryRankError& e) {
        return parallel::report_failure(world, e.what(), parallel::FailureKind::every_rank);
    } catch (const std::bad_alloc&) {
        return parallel::report_failure(world,
                                        "out of memory: an allocation failed (std::bad_alloc) " +
                                            parallel::describe_failure_site(),
                                        parallel::FailureKind::this_rank);
    } catch (const std::exception& e) {
        return parallel::report_failure(world, e.what(), parallel::FailureKind::this_rank);
    }
    return 0;
}

std::unique_ptr<parallel::Watchdog> start_watchdog(const config::Config& cfg,
                                                   const parallel::Grid& grid) {
    const auto& shape = grid.shape();
    if (shape.pipeline * shape.tensor * shape.context * shape.data == 1) return nullptr;
    const auto& t = cfg.training;
    parallel::WatchdogSettings settings;
    settings.timeout_s = t.collective_timeout;
    settings.first_step_s = t.collective_timeout_first_step;
    settings.checkpoint_s = t.collective_timeout_checkpoint;
    settings.grid = shape;
    settings.world_rank = grid.rank();
    return std::make_unique<parallel::Watchdog>(std::move(settings));
}

void check_fits_memory(const config::Config& cfg, int ranks_on_node) {
    const auto& p = cfg.parallel;
    const auto& t = cfg.training;
    const double share = static_cast<double>(cfg.derived.parameters) / (p.pipeline * p.tensor);
    const plan::PlanInputs in =
        plan::plan_inputs(cfg, plan::gradient_bytes(t.precision, t.fp32_grad_accumulation));
    const int weights = in.weight_bytes;
    plan::OptimizerBytes optimizer =
        plan::optimizer_bytes(in, model::ParamLayout(config::gpt_shape(cfg)));
    optimizer.matrices /= p.pipeline * p.tensor;
    optimizer.owned /= p.pipeline * p.tensor;
    plan::ModelStates states = plan::model_states(share, p.data * p.context, p.zero_stage, weights,
                                                  in.grad_bytes, optimizer);
    // With optimizer.offload: nvme the state is in files, not memory; with offload_params
    // ZeRO-3's weight shard too.
    if (cfg.optimizer.offload == config::Offload::nvme) states.optimizer = 0;
    if (cfg.optimizer.offload_params) states.weights = 0;
    const double per_rank = t.lora.enabled() ? share * weights : states.total();
    const double machine = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) *
                           static_cast<double>(::sysconf(_SC_PAGE_SIZE));
    if (machine <= 0 || per_rank * ranks_on_node <= machine) return;
    throw Error("model: " + train::human_count(static_cast<double>(cfg.derived.parameters)) +
                " parameters need at least " + train::human_bytes(per_rank) + " of " +
                (t.lora.enabled() ? "weights" : "weights, gradients and optimizer state") +
                " per rank (1/" + std::to_string(p.pipeline * p.tensor) + " of them, ZeRO stage " +
                std::to_string(p.zero_stage) + ") for " + std::to_string(ranks_on_node) +
                " rank(s) on this machine, more than its " + train::human_bytes(machine) +
                " of memory: use a smaller model, or more ranks and machines");
}

Device choose_device(const config::Config& cfg, parallel::World& world, bool announce) {
    Device device{false, false, "cpu"};
    if (cfg.device == config::DeviceKind::cpu) {
        if (announce) std::printf("device: cpu (the config's device: cpu)\n");
        return device;
    }
#if TRIDENT_HAVE_CUDA
    std::vector<std::string> missing;
    if (!parallel::every_rank_has_gpu(world, missing)) {
        // Alone, the rank need not be named: "rank 0: why" becomes "why".
        std::string where;
        if (world.size() == 1) {
            const std::string& why = missing.front();
            where = "no GPU is visible (" + why.substr(why.find(": ") + 2) + ")";
        } else {
            for (const std::string& m : missing)
                where += (where.empty() ? "no GPU for " : "; ") + m;
        }
        if (cfg.device == config::DeviceKind::cuda)
            throw Error("device: cuda, but " + where +
                        "; check CUDA_VISIBLE_DEVICES and the driver, or use device: auto or cpu");
        // Without an NVIDIA driver, CUDA's reason ("driver version is insufficient") is no
        // fault: the machine simply has no GPU. With one loaded, the reason matters.
        if (announce && std::filesystem::exists("/proc/driver/nvidia/version"))
            std::printf("device: cpu (auto: an NVIDIA driver is loaded, but %s)\n", where.c_str());
        else if (announce)
            std::printf("device: cpu (no GPU: CPU backend)\n");
        return device;
    }
    const parallel::GpuBinding binding = parallel::bind_gpu(world);
    device = Device{true, binding.shared, binding.gpu};
    if (announce) {
        std::printf("device: cuda (%s%s)\n",
                    cfg.device == config::DeviceKind::auto_ ? "auto: " : "", binding.gpu.c_str());
        std::printf("GPU libraries: %s\n", kernels::cuda::describe_libraries().c_str());
    }
#else
    (void)world;
    if (announce) std::printf("device: cpu (this build has no GPU backend: CPU backend)\n");
#endif
    return device;
}

std::unique_ptr<kernels::Ops> make_backend(const config::Config& cfg, const Device& device,
                                           parallel::Grid& grid, bool announce) {
    // A count beyond the bound is cut (kernels/threads.h), and said once.
    const kernels::ThreadCount threads =
        kernels::thread_count(cfg.training.threads, "training.threads");
    if (announce && !threads.note.empty()) warn(threads.note);
    if (!device.gpu) return kernels::make_cpu_ops(threads.count);
#if TRIDENT_HAVE_CUDA
    const config::ModelConfig& m = cfg.model;
    const auto& p = cfg.parallel;
    // The backend chooses the kernels of the run's attention now (kernels/cuda/cuda_ops.h):
    // a head size no kernel runs is the model's shape at fault.
    const kernels::RunAttention run{cfg.training.micro_batch,
                                    m.seq_len,
                                    m.heads * cfg.derived.head_dim,
                                    m.heads,
                                    p.tensor,
                                    p.context,
                                    p.context_mode == config::ContextMode::ring,
                                    cfg.training.precision,
                                    static_cast<float>(m.dropout),
                                    cfg.data.documents == config::DocumentMode::mask};
    kernels::CudaBackend backend;
    try {
        backend = kernels::make_cuda_backend(cfg.training.tf32, run);
    } catch (const Error& e) {
        throw Error(std::string("model.head_dim (else model.hidden / model.heads): ") + e.what());
    }
    if (announce) std::printf("%s", backend.attention.c_str());
    const cudaStream_t stream = kernels::cuda::compute_stream();
    if (device.shared_gpu) {
        // NCCL refuses two ranks of a communicator on one GPU.
        if (announce)
            std::printf(
                "communication: MPI through host memory (ranks share a GPU; NCCL needs "
                "one GPU per rank)\n");
        grid.wrap_comms(
            [&](std::unique_ptr<parallel::Comm> group) -> std::unique_ptr<parallel::Comm> {
                return std::make_unique<parallel::StagedComm>(std::move(group), stream);
            });
    } else {
        // The pipeline's and context parallelism's groups pass messages (activations and
        // gradients; ring attention's keys and values): theirs go through NCCL too.
        grid.wrap_comms(
            [&](std::unique_ptr<parallel::Comm> group) -> std::unique_ptr<parallel::Comm> {
                const parallel::GroupLabel* label = group->label();
                const bool messages =
                    label && (label->name == "pipeline" || label->name == "context");
                return std::make_unique<parallel::NcclComm>(std::move(group), stream, messages);
            });
    }
    return std::move(backend.ops);
#else
    (void)grid;
    (void)announce;
    throw Error("internal: a GPU device in a build without the GPU backend");
#endif
}

Peak peak_flops(const config::Config& cfg, const Device& device, kernels::Ops& ops,
                parallel::Comm& world) {
    if (cfg.hardware.peak_flops > 0)
        return {cfg.hardware.peak_flops, "hardware.peak_flops; MFU is against this"};
    if (device.gpu) {
        const double datasheet = train::datasheet_peak_flops(device.name);
        if (datasheet > 0) return {datasheet, "dense bf16, datasheet; MFU is against this"};
    }
    // Ranks that share a machine measure at once: the most any one reached is the closest to
    // what a rank can do (and every rank takes the same figure).
    double measured = train::measure_gemm_flops(ops);
    world.all_reduce(&measured, 1, parallel::ReduceOp::max);
    return {measured,
            "fp32 GEMM measured at start-up, best of several; MFU is against this "
            "(hardware.peak_flops sets it)"};
}

void warn(const std::string& text, const char* kind) {
    std::fprintf(stderr, "trident: %s: %s\n", kind, text.c_str());
    std::fflush(stderr);
}

void print_warnings(const config::Config& cfg) {
    for (const std::string& w : cfg.warnings) warn(w);
    for (const std::string& n : cfg.notes) warn(n, "note");
}

void print_summary(const config::Config& cfg, const kernels::Ops& ops, const Peak& peak) {
    const auto& m = cfg.model;
    const auto& t = cfg.training;
    const auto& d = cfg.derived;
    // A grouped attention's key/value heads, and whether the LM head is its own.
    const bool grouped =
        model::resolve_spec(config::gpt_shape(cfg)).layers.front().attention->grouped;
    const std::string heads =
        std::to_string(m.heads) + (grouped ? " | kv_heads " + std::to_string(m.kv_heads) : "");
    std::string count = train::human_count(static_cast<double>(d.parameters));
    if (d.active_parameters != d.parameters)  // a mixture of experts
        count += " (" + train::human_count(static_cast<double>(d.active_parameters)) + " active)";
    std::printf(
        "model: %s, %s parameters | layers %d | hidden %d | heads %s | ffn %d | seq %d | "
        "vocab %d (padded %d)%s\n",
        config::to_string(m.arch), count.c_str(), m.layers, m.hidden, heads.c_str(), m.ffn_hidden,
        m.seq_len, m.vocab_size, d.padded_vocab, m.tie_embeddings ? "" : " | untied head");
    const auto& p = cfg.parallel;
    std::printf("layout: %s | backend %s | precision %s\n",
                config::layout_text(p.pipeline, p.tensor, p.context, p.data).c_str(), ops.name(),
                kernels::name_of(t.precision));
    if (cfg.parallel.context > 1)
        std::printf(
            "context: %d tokens of each sequence per rank (chunks i and %d - i of %d), "
            "attention by %s\n",
            cfg.model.seq_len / cfg.parallel.context, 2 * cfg.parallel.context - 1,
            2 * cfg.parallel.context, config::to_string(cfg.parallel.context_mode));
    if (d.chunk_layers.size() > 1) {
        std::string cuts;
        for (int n : d.chunk_layers) cuts += (cuts.empty() ? "" : ", ") + std::to_string(n);
        std::printf("pipeline: layers per chunk %s (parallel.stage_layers: %s)\n", cuts.c_str(),
                    config::to_string(cfg.parallel.stage_layers).c_str());
    }
    std::printf(
        "batch: %s = %lld tokens per step | micro batch %d | %s per replica | %s FLOP per "
        "step\n",
        train::counted(t.global_batch, "sequence").c_str(),
        static_cast<long long>(d.tokens_per_step), t.micro_batch,
        train::counted(d.grad_accum_steps, "microbatch").c_str(),
        train::human_count(d.flops_per_step).c_str());
    std::printf("peak: %.1f GFLOP/s (%s)\n", peak.flops / 1e9, peak.source.c_str());
}

void print_outputs(const config::Config& cfg) {
    const auto& ck = cfg.checkpoint;
    const auto& lg = cfg.logging;
    std::string checkpoints = "none (checkpoint.dir is not set)";
    if (ck.dir)
        checkpoints =
            *ck.dir +
            (ck.interval > 0 ? " every " + std::to_string(ck.interval) + " steps and at the end"
                             : " at the end") +
            ", newest " + std::to_string(ck.keep) + " kept";
    std::printf("output: checkpoints %s | metrics %s | trace %s | tensorboard %s\n",
                checkpoints.c_str(), lg.metrics ? lg.metrics->c_str() : "none",
                lg.trace ? lg.trace->c_str() : "none",
                lg.tensorboard ? lg.tensorboard->c_str() : "none");
}

std::string initialise_weights(const config::Config& cfg, model::Gpt& model) {
    std::string read;
    const model::ParamLayout& full_layout = model.weights().whole();
    const auto init_std = static_cast<float>(cfg.model.init_std);
    if (cfg.model.init_from || model.nf4_base()) {
        // The whole model, from the file or its initialisation; each tensor-parallel rank keeps
        // its slice, and a 4-bit base quantizes each matrix whole (model/nf4_base.h).
        std::vector<float> full(full_layout.total(), 0.0f);
        if (cfg.model.init_from)
            read = train::load_base_weights(*cfg.model.init_from, full_layout, full.data());
        else
            full = model::random_whole(full_layout, cfg.training.seed, init_std);
        if (const model::Nf4Base* base = model.nf4_base()) {
            // The dense copy holds the base as the 4-bit one computes it (samples, exports).
            model.quantize_base(full);
            model::round_trip_base(full_layout, full.data(), base->block(), base->double_quant());
        }
        model.weights().load_whole(full);
    } else {
        model::init_random(model.weights(), cfg.training.seed, init_std);
    }
    if (model.frozen()) {
        const model::ParamLayout& whole = model.adapters().whole();
        std::vector<float> adapters;
        if (const auto& from = cfg.training.lora.init_from) {
            adapters.assign(whole.total(), 0.0f);
            model::load_lora_file(*from, whole, adapters.data());
        } else {
            adapters = model::initial_lora(whole, cfg.training.seed);
        }
        model.adapters().load_whole(adapters);
    }
    return read;
}

void generate_text(model::Decoder& model, const data::Tokenizer& tokenizer,
                   const std::string& prompt, const train::SamplingOptions& opts,
                   const std::function<void(const std::string&)>& emit) {
    std::vector<int32_t> ids;
    tokenizer.encode(prompt, ids);
    if (ids.empty()) tokenizer.encode("\n", ids);
    if (prompt.empty() && tokenizer.end_of_text()) ids.assign(1, *tokenizer.end_of_text());
    emit(prompt);
    train::generate(model, ids, opts,
                    [&](int32_t id) { emit(tokenizer.decode(std::span<const int32_t>(&id, 1))); });
}

}  // namespace trident::commands
