// The plan as text and as JSON (see report.h).
#include "plan/report.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>

#include "io/json_line.h"
#include "plan/stage_shape.h"
#include "train/metrics.h"

namespace trident::plan {

std::string format(const char* fmt, ...) {
    va_list args, again;
    va_start(args, fmt);
    va_copy(again, args);
    std::string out(static_cast<std::size_t>(std::vsnprintf(nullptr, 0, fmt, args)), '\0');
    std::vsnprintf(out.data(), out.size() + 1, fmt, again);
    va_end(again);
    va_end(args);
    return out;
}

namespace {

// Traffic, counted in decimal units like bandwidth: "12.3 GB".
std::string bytes_text(double bytes) {
    if (bytes >= 1e9) return format("%.2f GB", bytes / 1e9);
    if (bytes >= 1e6) return format("%.1f MB", bytes / 1e6);
    return bytes > 0 ? format("%.1f KB", bytes / 1e3) : "0";
}

std::string range(int64_t first, int64_t last) {
    return first == last ? std::to_string(first)
                         : std::to_string(first) + "-" + std::to_string(last);
}

// The layers a stage holds, over its chunks.
int stage_layers(const config::Config& cfg, int stage) {
    int layers = 0;
    for (const ChunkShape& c : stage_chunks(cfg, stage)) layers += c.layers;
    return layers;
}

// The ranks of stage s: rank = tp + M·(dp + D·pp), so one contiguous run.
int64_t first_rank(const config::Config& cfg, int stage) {
    return int64_t{stage} * cfg.parallel.tensor * cfg.parallel.context * cfg.parallel.data;
}
int64_t last_rank(const config::Config& cfg, int stage) {
    return first_rank(cfg, stage + 1) - 1;
}

double headroom(const Plan& plan, const StageMemory& s) {
    return *plan.device_memory - s.total();
}

struct NamedGroup {
    const char* name;
    const GroupTraffic* traffic;
};
std::vector<NamedGroup> groups(const StageTraffic& t) {
    return {{"tensor", &t.tensor},
            {"context", &t.context},
            {"pipeline", &t.pipeline},
            {"embedding", &t.embedding},
            {"data", &t.data},
            {"kv-replica", &t.kv_replica},
            {"data-replica", &t.data_replica},
            {"expert", &t.expert},
            {"expert-shard", &t.expert_shard}};
}

double percent(double part, double whole) {
    return whole > 0 ? 100.0 * part / whole : 0.0;
}

// The text's opening lines: the config, model, layout, step and bytes per element.
std::string summary_text(const PlanInputs& in) {
    const config::Config& cfg = in.cfg;
    const auto& m = cfg.model;
    const auto& p = cfg.parallel;
    const auto& t = cfg.training;
    const auto& d = cfg.derived;
    std::string out = format("plan: %s\n", cfg.source.c_str());
    std::string count = train::human_count(static_cast<double>(d.parameters)) + " parameters";
    if (d.active_parameters != d.parameters)  // a mixture of experts
        count += format(" (%s active per token: %d of %d experts)",
                        train::human_count(static_cast<double>(d.active_parameters)).c_str(),
                        m.moe.top_k, m.moe.experts);
    out += format(
        "model: %s | layers %d | hidden %d | heads %d | ffn %d | seq %d | vocab %d (padded %d)\n",
        count.c_str(), m.layers, m.hidden, m.heads, m.ffn_hidden, m.seq_len, m.vocab_size,
        d.padded_vocab);
    out += format("layout: %s, rank = tp + %d*(cp + %d*(dp + %d*pp))",
                  config::layout_text(p.pipeline, p.tensor, p.context, p.data).c_str(), p.tensor,
                  p.context, p.data);
    if (p.context > 1)
        out += format(" | context %s, %d tokens per rank", config::to_string(p.context_mode),
                      m.seq_len / p.context);
    out += format(" | schedule %s", pipeline::to_string(p.schedule));
    if (p.virtual_stages > 1) out += format(", %d chunks per stage", p.virtual_stages);
    out += format(" | sequence parallel %s", p.sequence_parallel ? "on" : "off");
    if (p.tp_overlap) out += format(", its exchanges in %d pieces under the GEMMs", p.tensor);
    out += "\n";
    out += format("step: %s (%lld tokens) | micro batch %d | %s per replica | recompute %s\n",
                  train::counted(t.global_batch, "sequence").c_str(),
                  static_cast<long long>(d.tokens_per_step), t.micro_batch,
                  train::counted(d.grad_accum_steps, "microbatch").c_str(),
                  config::to_string(t.recompute));
    out += format(
        "bytes: precision %s | per parameter: weights %d, gradients %d, optimizer %s "
        "(ZeRO stage %d over %s%s) | per activation %d\n\n",
        kernels::name_of(t.precision), in.weight_bytes, in.grad_bytes,
        in.matrix_optimizer_bytes == in.optimizer_bytes
            ? format("%d", in.optimizer_bytes).c_str()
            : format("%d (layer matrices %d%s)", in.optimizer_bytes, in.matrix_optimizer_bytes,
                     cfg.optimizer.name == config::OptimizerName::galore
                         ? ", and per matrix its projected moments and projector on its owner"
                         : "")
                  .c_str(),
        in.zero_stage, train::counted(p.shard_ranks(), "replica").c_str(),
        p.shard_ranks() == p.data * p.context
            ? ""
            : format(", replicated across %d shard groups", p.data * p.context / p.shard_ranks())
                  .c_str(),
        in.activation_bytes);
    return out;
}

// The memory table, a row per stage (with a device's memory, whether it fits), and the
// activations by Korthikanti et al.'s formula.
std::string memory_table_text(const Plan& plan) {
    const config::Config& cfg = plan.inputs.cfg;
    const auto& p = cfg.parallel;
    std::string out = "memory per rank (the ranks of a stage hold the same):\n";
    out += format("%-5s %-11s %-3s %-7s %-7s %6s %13s %10s %10s %10s %11s %4s %10s %10s", "stage",
                  "ranks", "pp", "tp", "dp", "layers", "parameters", "weights", "gradients",
                  "optimizer", "activations", "sets", "temporary", "total");
    if (plan.device_memory)
        out += format("  fits in %s (headroom)", train::human_bytes(*plan.device_memory).c_str());
    out += "\n";
    for (const StageMemory& s : plan.memory) {
        out +=
            format("%-5d %-11s %-3d %-7s %-7s %6d %13lld %10s %10s %10s %11s %4d %10s %10s",
                   s.stage, range(first_rank(cfg, s.stage), last_rank(cfg, s.stage)).c_str(),
                   s.stage, range(0, p.tensor - 1).c_str(), range(0, p.data - 1).c_str(),
                   stage_layers(cfg, s.stage), static_cast<long long>(s.parameters),
                   train::human_bytes(s.states.weights).c_str(),
                   train::human_bytes(s.states.gradients).c_str(),
                   train::human_bytes(s.states.optimizer).c_str(),
                   train::human_bytes(s.activations).c_str(), s.activation_sets,
                   train::human_bytes(s.temporary).c_str(), train::human_bytes(s.total()).c_str());
        if (plan.device_memory) {
            const double room = headroom(plan, s);
            out += format("  %s (%s%s)", room >= 0 ? "yes" : "NO", room >= 0 ? "" : "short by ",
                          train::human_bytes(room >= 0 ? room : -room).c_str());
        }
        out += "\n";
    }
    if (cfg.optimizer.offload == config::Offload::nvme)
        out += format(
            "optimizer%s: one chunk on the device; in optimizer.offload_dir's files, %s "
            "per rank of stage 0 (not in the total)\n",
            cfg.optimizer.offload_params ? " state and ZeRO-3's weight shard" : "",
            train::human_bytes(plan.memory.front().offloaded).c_str());
    if (cfg.optimizer.offload == config::Offload::host)
        out += format(
            "optimizer: %s on the device; in host memory, %s per rank of stage 0 (not in the "
            "total)\n",
            plan.memory.front().states.optimizer > 0 ? "the per-matrix state alone" : "none",
            train::human_bytes(plan.memory.front().offloaded).c_str());
    out +=
        "activations by Korthikanti et al.'s per-layer formula (masks and dropout copies "
        "kept):";
    for (const StageMemory& s : plan.memory)
        out += format(" stage %d %s;", s.stage, train::human_bytes(s.korthikanti).c_str());
    out.back() = '\n';
    return out;
}

// Calls of one kind in a group's step, and their payload in bytes.
std::pair<int64_t, double> calls_of(const GroupTraffic& g, parallel::CommKind kind) {
    int64_t calls = 0;
    double bytes = 0;
    for (const Calls& c : g.calls)
        if (c.kind == kind) {
            calls += c.calls;
            bytes += static_cast<double>(c.calls) * c.elements * c.element_bytes;
        }
    return {calls, bytes};
}

// ZeRO-3's two settings of parallel.reshard_after_forward side by side, this config's first:
// the weights gathered at once and the data group's all-gathers and reduce-scatters.
std::string zero3_text(const PlanInputs& in) {
    if (in.zero_stage != 3) return "";
    using parallel::CommKind;
    std::string out =
        "ZeRO-3 per stage and step: weights gathered at once, all-gathers, reduce-scatters "
        "(payload):\n";
    const bool chosen = in.cfg.parallel.reshard_after_forward;
    for (const bool reshard : {chosen, !chosen}) {
        PlanInputs other = in;
        other.cfg.parallel.reshard_after_forward = reshard;
        const std::vector<StageMemory> memory = plan_memory(other);
        const std::vector<StageTraffic> traffic = plan_traffic(other);
        out += format("  reshard_after_forward %s%s:", reshard ? "true" : "false",
                      reshard == chosen ? " (this config)" : "");
        for (std::size_t s = 0; s < memory.size(); ++s) {
            const auto [gathers, gathered] = calls_of(traffic[s].data, CommKind::all_gather);
            const auto [scatters, scattered] = calls_of(traffic[s].data, CommKind::reduce_scatter);
            out += format(" stage %zu %s, %lld (%s), %lld (%s);", s,
                          train::human_bytes(memory[s].gathered).c_str(),
                          static_cast<long long>(gathers), bytes_text(gathered).c_str(),
                          static_cast<long long>(scatters), bytes_text(scattered).c_str());
        }
        out.back() = '\n';
    }
    return out;
}

// The communication table: a row per stage and group that communicates.
std::string communication_table_text(const Plan& plan) {
    std::string out =
        "\ncommunication per step of one rank (payload as Comm counts it; sent: ring "
        "algorithms):\n";
    out += format("%-6s %-12s %6s %8s %12s %12s\n", "stage", "group", "ranks", "calls", "payload",
                  "sent");
    bool any = false;
    for (std::size_t s = 0; s < plan.traffic.size(); ++s)
        for (const NamedGroup& g : groups(plan.traffic[s])) {
            any = any || !g.traffic->calls.empty();
            if (g.traffic->calls.empty()) continue;
            out += format("%-6zu %-12s %6d %8lld %12s %12s\n", s, g.name, g.traffic->size,
                          static_cast<long long>(g.traffic->call_count()),
                          bytes_text(g.traffic->payload_bytes()).c_str(),
                          bytes_text(g.traffic->sent_bytes()).c_str());
        }
    if (!any) out += "none: every group is one rank\n";
    return out;
}

// Expert parallelism's all-to-alls of one MoE layer and microbatch (the first stage holding
// one): their calls and payload, and with hardware figures their time.
std::string expert_layer_text(const Plan& plan) {
    const config::Config& cfg = plan.inputs.cfg;
    const int64_t m = cfg.derived.grad_accum_steps;
    for (std::size_t s = 0; s < plan.traffic.size(); ++s) {
        const GroupTraffic& g = plan.traffic[s].expert;
        const int64_t layers = moe_layers(cfg, static_cast<int>(s));
        if (g.calls.empty() || layers == 0) continue;
        const double per = static_cast<double>(m * layers);
        std::string out = format(
            "expert parallelism over %d ranks, per MoE layer and microbatch: %lld all-to-alls, "
            "payload %s (sent %s)",
            g.size, static_cast<long long>(g.call_count() / (m * layers)),
            bytes_text(g.payload_bytes() / per).c_str(), bytes_text(g.sent_bytes() / per).c_str());
        const int slowest = plan.time ? plan.time->slowest_stage : -1;
        const int64_t timed = slowest >= 0 ? moe_layers(cfg, slowest) : 0;
        if (timed > 0)
            out += format(", %.4g ms on %s", plan.time->expert_comm / (m * timed) * 1e3,
                          plan.hardware->name.c_str());
        return out + "\n";
    }
    return "";
}

// The predicted step time and its parts; without hardware figures, how to give them.
std::string step_time_text(const Plan& plan) {
    if (!plan.time) {
        std::string out = "\nstep time: give --hardware (";
        for (const std::string& name : hardware_presets()) out += name + "|";
        out.back() = ')';
        out += " or --gemm-tflops, --mem-bw, --intra-bw and --inter-bw to predict it\n";
        return out;
    }
    const PlanInputs& in = plan.inputs;
    const auto& p = in.cfg.parallel;
    const auto& d = in.cfg.derived;
    const Hardware& hw = *plan.hardware;
    const StepTime& st = *plan.time;
    // As the runtime overlaps it (optim/adamw.h).
    const bool reduce_overlapped = in.zero_stage <= 1 && p.overlap_grad_reduce;
    const bool gather_overlapped = in.zero_stage == 1 && p.overlap_param_gather;
    std::string overlap =
        reduce_overlapped ? "reduction under the backward" : "reduction after the backward";
    if (gather_overlapped) overlap += ", all-gather under the next forward";
    std::string out = format(
        "\nstep time on %s (GEMM %.0f TFLOP/s, memory %.0f GB/s, intra-node %.0f GB/s "
        "and inter-node %.2f GB/s per GPU, %d GPUs per node, %.0f us per call, "
        "data-parallel %s):\n",
        hw.name.c_str(), hw.gemm_flops / 1e12, hw.memory_bandwidth / 1e9, hw.intra_bandwidth / 1e9,
        hw.inter_bandwidth / 1e9, hw.gpus_per_node, hw.latency * 1e6, overlap.c_str());
    out += format(
        "  %.4g s per step | %.0f tokens/s | %.1f TFLOP/s per GPU (model FLOPs) | "
        "slowest stage %d\n",
        st.step, static_cast<double>(d.tokens_per_step) / st.step,
        d.flops_per_step / st.step / d.world_size / 1e12, st.slowest_stage);
    std::string context =
        p.context > 1 ? format(" | context comm %.1f%%", percent(st.context_comm, st.step)) : "";
    if (p.expert > 1) context += format(" | expert comm %.1f%%", percent(st.expert_comm, st.step));
    out += format(
        "  compute %.1f%% | tensor comm %.1f%%%s | pipeline comm %.1f%% | bubble %.1f%% "
        "(formula %.4g of ideal) | data comm %.1f%% | optimizer %.1f%%\n",
        percent(st.compute, st.step), percent(st.tensor_comm, st.step), context.c_str(),
        percent(st.pipeline_comm, st.step), percent(st.bubble, st.step),
        pipeline::bubble_formula(p.schedule, p.pipeline, p.virtual_stages,
                                 static_cast<int>(d.grad_accum_steps)),
        percent(st.data_comm, st.step), percent(st.optimizer, st.step));
    if (in.cfg.optimizer.offload == config::Offload::nvme)
        out += format(
            "  offload: the optimizer state's file%s read and written, %.4g s a step at %.1f "
            "GB/s (%s)%s\n",
            in.cfg.optimizer.offload_params ? " and the weight shard's" : "", st.offload_io,
            hw.disk_bandwidth / 1e9,
            hw.disk_bandwidth == Hardware{}.disk_bandwidth ? "assumed: one NVMe drive per rank; "
                                                             "--disk-bw sets it"
                                                           : "--disk-bw",
            st.offload_io > st.compute ? ": the step is I/O-bound (more than its compute)" : "");
    if (in.cfg.optimizer.offload == config::Offload::host)
        out += format(
            "  offload: the gradients down and the weights up between device and host, %.4g s "
            "a step at %.1f GB/s each way, and the update in host memory at %.1f GB/s "
            "(both assumed)%s\n",
            st.offload_io, hw.host_link_bandwidth / 1e9, hw.host_memory_bandwidth / 1e9,
            st.offload_io > st.compute ? ": the step is I/O-bound (more than its compute)" : "");
    return out;
}

// A byte count as a JSON integer: exact, where %.9g would round a large one.
int64_t byte_count(double b) {
    return std::llround(b);
}

io::JsonLine model_json(const config::Config& cfg) {
    io::JsonLine model;
    model.add("parameters", cfg.derived.parameters)
        .add("active_parameters", cfg.derived.active_parameters)
        .add("layers", cfg.model.layers)
        .add("hidden", cfg.model.hidden)
        .add("heads", cfg.model.heads)
        .add("ffn_hidden", cfg.model.ffn_hidden)
        .add("seq_len", cfg.model.seq_len)
        .add("vocab_size", cfg.model.vocab_size)
        .add("padded_vocab", cfg.derived.padded_vocab);
    return model;
}

io::JsonLine memory_json(const Plan& plan, const StageMemory& s) {
    io::JsonLine mem;
    mem.add("parameters", s.parameters)
        .add("weights", byte_count(s.states.weights))
        .add("gradients", byte_count(s.states.gradients))
        .add("optimizer", byte_count(s.states.optimizer))
        .add("activations", byte_count(s.activations))
        .add("activation_sets", s.activation_sets)
        .add("korthikanti_activations", byte_count(s.korthikanti))
        .add("temporary", byte_count(s.temporary))
        .add("gathered", byte_count(s.gathered))
        .add("offloaded", byte_count(s.offloaded))
        .add("total", byte_count(s.total()));
    if (plan.device_memory)
        mem.add("fits", headroom(plan, s) >= 0).add("headroom", byte_count(headroom(plan, s)));
    return mem;
}

io::JsonLine communication_json(const StageTraffic& traffic) {
    io::JsonLine comm;
    for (const NamedGroup& g : groups(traffic)) {
        io::JsonLine group;
        group.add("ranks", g.traffic->size)
            .add("calls", g.traffic->call_count())
            .add("payload_bytes", byte_count(g.traffic->payload_bytes()))
            .add("sent_bytes", byte_count(g.traffic->sent_bytes()));
        comm.add(g.name, group);
    }
    return comm;
}

// One stage: its ranks, its memory and its communication.
io::JsonLine stage_json(const Plan& plan, const StageMemory& s) {
    const config::Config& cfg = plan.inputs.cfg;
    std::vector<int64_t> ranks;
    for (int64_t r = first_rank(cfg, s.stage); r <= last_rank(cfg, s.stage); ++r)
        ranks.push_back(r);
    io::JsonLine st;
    st.add("pp", s.stage)
        .add("ranks", ranks)
        .add("tensor", cfg.parallel.tensor)
        .add("data", cfg.parallel.data)
        .add("layers", stage_layers(cfg, s.stage));
    st.add("memory_bytes", memory_json(plan, s));
    st.add("communication", communication_json(plan.traffic[static_cast<std::size_t>(s.stage)]));
    return st;
}

}  // namespace

io::JsonLine layout_json(const PlanInputs& in) {
    const config::Config& cfg = in.cfg;
    const auto& p = cfg.parallel;
    io::JsonLine layout;
    layout.add("pipeline", p.pipeline)
        .add("tensor", p.tensor)
        .add("context", p.context)
        .add("data", p.data)
        .add("data_shard", p.shard_ranks())
        .add("virtual_stages", p.virtual_stages)
        .add("schedule", pipeline::to_string(p.schedule))
        .add("sequence_parallel", p.sequence_parallel)
        .add("tp_overlap", p.tp_overlap)
        .add("zero_stage", in.zero_stage)
        .add("micro_batch", cfg.training.micro_batch)
        .add("global_batch", cfg.training.global_batch)
        .add("microbatches", cfg.derived.grad_accum_steps)
        .add("recompute", config::to_string(cfg.training.recompute))
        .add("precision", kernels::name_of(cfg.training.precision));
    return layout;
}

// The predicted step time with the hardware figures it assumed (plan.time must be set).
io::JsonLine step_time_json(const Plan& plan) {
    const auto& d = plan.inputs.cfg.derived;
    const Hardware& hw = *plan.hardware;
    const StepTime& st = *plan.time;
    io::JsonLine h;
    h.add("name", std::string_view(hw.name))
        .add("gemm_flops", hw.gemm_flops)
        .add("memory_bandwidth", hw.memory_bandwidth)
        .add("intra_bandwidth", hw.intra_bandwidth)
        .add("inter_bandwidth", hw.inter_bandwidth)
        .add("gpus_per_node", hw.gpus_per_node)
        .add("latency", hw.latency)
        .add("disk_bandwidth", hw.disk_bandwidth);
    io::JsonLine time;
    time.add("hardware", h)
        .add("step_s", st.step)
        .add("tokens_per_s", static_cast<double>(d.tokens_per_step) / st.step)
        .add("model_flops_per_gpu_per_s", d.flops_per_step / st.step / d.world_size)
        .add("executed_flops_slowest_stage", st.executed_flops)
        .add("slowest_stage", st.slowest_stage)
        .add("compute_s", st.compute)
        .add("tensor_comm_s", st.tensor_comm)
        .add("context_comm_s", st.context_comm)
        .add("expert_comm_s", st.expert_comm)
        .add("pipeline_comm_s", st.pipeline_comm)
        .add("bubble_s", st.bubble)
        .add("data_comm_s", st.data_comm)
        .add("optimizer_s", st.optimizer);
    if (plan.inputs.cfg.optimizer.offload != config::Offload::none)
        time.add("offload_io_s", st.offload_io).add("io_bound", st.offload_io > st.compute);
    return time;
}

Plan make_plan(const PlanInputs& inputs, const std::optional<Hardware>& hardware,
               const std::optional<double>& device_memory) {
    Plan plan;
    plan.inputs = inputs;
    plan.memory = plan_memory(inputs);
    plan.traffic = plan_traffic(inputs);
    plan.hardware = hardware;
    if (hardware) plan.time = predict_step(inputs, *hardware);
    plan.device_memory = device_memory;
    return plan;
}

std::string render_text(const Plan& plan) {
    const config::Config& cfg = plan.inputs.cfg;
    const auto& d = cfg.derived;
    std::string out = summary_text(plan.inputs);
    out += memory_table_text(plan);
    out += zero3_text(plan.inputs);
    out += format(
        "\nFLOPs per step (Megatron's model FLOPs, 6*B*s per weight of the layers' linears and "
        "the head + 6*B*s^2*l*h): %.4g, %.4g per GPU\n",
        d.flops_per_step, d.flops_per_step / d.world_size);
    if (d.active_parameters != d.parameters)
        out += format(
            "(each routed expert's weights on the share of tokens routed to it, %d/%d: "
            "the active experts only)\n",
            cfg.model.moe.top_k, cfg.model.moe.experts);
    if (plan.inputs.doc_len > 0)
        out += format(
            "attention within documents of %d tokens on average (--doc-len): %.4g of a causal "
            "window's scores computed, in the step time (the model FLOPs count whole windows)\n",
            plan.inputs.doc_len, plan.inputs.attended());
    if (plan.inputs.matrix_step_flops > 0)
        out += format(
            "optimizer FLOPs per step (%s's whole-matrix steps, each layer matrix on one rank; "
            "in the step time, not the model FLOPs): %.4g\n",
            config::to_string(cfg.optimizer.name), plan.inputs.matrix_step_flops);
    out += communication_table_text(plan);
    out += expert_layer_text(plan);
    out += step_time_text(plan);
    return out;
}

std::string render_json(const Plan& plan) {
    const PlanInputs& in = plan.inputs;
    const config::Config& cfg = in.cfg;
    const auto& d = cfg.derived;
    io::JsonLine root;
    root.add("config", std::string_view(cfg.source));
    root.add("model", model_json(cfg));
    root.add("layout", layout_json(in));
    io::JsonLine bytes;
    bytes.add("weight", in.weight_bytes)
        .add("gradient", in.grad_bytes)
        .add("optimizer", in.optimizer_bytes)
        .add("optimizer_matrix", in.matrix_optimizer_bytes)
        .add("activation", in.activation_bytes);
    root.add("bytes_per_element", bytes);
    std::vector<io::JsonLine> stages;
    for (const StageMemory& s : plan.memory) stages.push_back(stage_json(plan, s));
    root.add("stages", stages);
    io::JsonLine flops;
    flops.add("model_flops_per_step", d.flops_per_step)
        .add("model_flops_per_gpu", d.flops_per_step / d.world_size)
        .add("optimizer_flops_per_step", in.matrix_step_flops)
        .add("attended_fraction", in.attended());
    root.add("flops", flops);
    if (plan.device_memory) root.add("device_memory_bytes", byte_count(*plan.device_memory));
    if (plan.time) root.add("step_time", step_time_json(plan));
    return root.str() + "\n";
}

}  // namespace trident::plan
