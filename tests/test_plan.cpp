// The planner (src/plan/, `trident plan`) against published figures and against Trident's
// own runs: the parameter counts of Megatron-LM's 2019 series, ZeRO's Table 1, the memory
// that real CPU runs measure (to the byte, or within the allocator's rounding), Megatron-LM's
// Figure 5 weak scaling, and bad input.
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "cli_support.h"
#include "config/config.h"
#include "io/json_reader.h"
#include "pipeline/simulator.h"
#include "plan/communication.h"
#include "plan/memory_model.h"
#include "plan/perf_model.h"
#include "plan/stage_shape.h"

namespace {

using namespace trident;

// The Megatron-LM 2019 series as the repository's configs describe it.
config::Config megatron(const std::string& size, const std::vector<std::string>& overrides = {}) {
    return config::load(TRIDENT_SOURCE_DIR "/configs/megatron-" + size + ".yaml", overrides,
                        config::Purpose::plan);
}

plan::PlanInputs inputs(const config::Config& cfg) {
    return plan::plan_inputs(
        cfg, plan::gradient_bytes(cfg.training.precision, cfg.training.fp32_grad_accumulation));
}

// A model of 4 layers on the workspace's data (a vocabulary of 64), 2 steps.
std::string small_config(const cli::Workspace& ws) {
    return ws.write("plan.yaml",
                    "model: {vocab_size: 64, seq_len: 16, layers: 4, hidden: 32, heads: 4, "
                    "ffn_hidden: 128, dropout: 0.1}\n"
                    "training: {micro_batch: 2, global_batch: 8, steps: 2, warmup_steps: 1, "
                    "threads: 1}\n"
                    "logging: {metrics: " +
                        ws.path("metrics.jsonl") +
                        "}\n"
                        "data: {train: " +
                        ws.path("train.bin") + "}\n");
}

std::string set_flags(const std::vector<std::string>& overrides) {
    std::string flags;
    for (const std::string& o : overrides) flags += " --set " + o;
    return flags;
}

// The last record of a metrics file.
io::json::Value last_metrics(const std::string& path) {
    std::ifstream in(path);
    std::string line, last;
    while (std::getline(in, line))
        if (!line.empty()) last = line;
    REQUIRE(!last.empty());
    return io::json::parse(last);
}

double number(const io::json::Value& record, const char* key) {
    const io::json::Value* v = record.find(key);
    REQUIRE(v != nullptr);
    return v->is_integer() ? static_cast<double>(v->integer) : v->real;
}

// The memory figures of rank 0 (the metrics are written by rank 0, which holds stage 0), as
// measured and as the plan's stage 0 has them.
struct MemoryFigures {
    double params = 0, grads = 0, optimizer = 0, activations = 0, peak = 0;
};

// The planner counts each buffer's bytes; the CPU allocator rounds every buffer up to 64 bytes,
// its alignment, and the optimizer state, activations and peak are measured as allocated. The
// parameters and gradients are measured as their buffers' sizes, so the plan holds them to
// the byte; the other three it holds to the byte only where every buffer is a multiple of 64
// bytes (as in the small config), and otherwise falls short by at most 63 bytes a buffer.
struct MemoryCompared {
    MemoryFigures measured, planned;  // rank 0's: stage 0
    // Every pipeline stage's first rank, measured (the metrics' mem_stages) and planned.
    std::vector<MemoryCompared> stages;
    int64_t expected_params = 0;  // stage's parameter elements, counted here from the shapes
};

// The parameter elements tensor rank 0 of `stage` holds, counted from the model's shapes
// as Megatron splits them (docs/FORMULAS.md), independently of ParamLayout and the planner:
// each layer's LayerNorms and row-parallel biases whole, the rest split over M; wte's
// vocabulary rows over M on the first and the last stage, wpe on the first, ln_f on the last.
// Llama: two RMSNorm weights whole, no biases, k and v at the key/value heads' width (a whole
// head per rank when M exceeds them), SwiGLU's three matrices, no wpe, an untied lm_head.
int64_t expected_param_elements(const config::Config& cfg, int stage) {
    const int64_t H = cfg.model.hidden, F = cfg.model.ffn_hidden, T = cfg.model.seq_len;
    const int64_t M = cfg.parallel.tensor, P = cfg.parallel.pipeline;
    const int64_t Vp = cfg.derived.padded_vocab;
    const bool llama = cfg.model.arch == model::Arch::llama;
    const int64_t d = H / cfg.model.heads, KVH = cfg.model.kv_heads;
    const int64_t kv = KVH >= M ? KVH * d * H / M : d * H;  // k_proj's (and v_proj's) share
    const int64_t layer =
        llama ? 2 * H + 2 * H * H / M + 2 * kv + 3 * F * H / M
              : 4 * H + (3 * H * H + 3 * H) / M + H * H / M + H + (F * H + F) / M + H * F / M + H;
    int64_t layers = 0;
    const auto& cut = cfg.derived.chunk_layers;
    for (std::size_t g = 0; g < cut.size(); ++g)
        if (static_cast<int64_t>(g) % P == stage) layers += cut[g];
    int64_t n = layers * layer;
    if (stage == 0) n += Vp / M * H + (llama ? 0 : T * H);
    if (stage == P - 1) n += (P > 1 || llama ? Vp / M * H : 0) + (llama ? H : 2 * H);
    return n;
}

// Trains `overrides` of `config` (under mpirun when `ranks` > 1) and returns rank 0's measured
// memory beside the plan's stage 0; checks the activation sets and the traffic exactly.
MemoryCompared measure_memory(const std::string& config, const std::string& metrics,
                              const std::vector<std::string>& overrides, int ranks) {
    const std::string launch =
        ranks > 1 ? "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " +
                        std::string(TRIDENT_MPIEXEC) + " -n " + std::to_string(ranks) + " "
                  : "";
    const auto run = cli::run_shell(launch + std::string(TRIDENT_BINARY) + " train --config " +
                                    config + set_flags(overrides));
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
    const io::json::Value measured = last_metrics(metrics);

    const plan::PlanInputs in = inputs(config::load(config, overrides, config::Purpose::plan));
    const plan::StageMemory planned = plan::plan_memory(in).front();
    CHECK(number(measured, "activation_sets") == planned.activation_sets);
    MemoryCompared c;
    c.measured = {number(measured, "mem_params_bytes"), number(measured, "mem_grads_bytes"),
                  number(measured, "mem_optimizer_bytes"),
                  number(measured, "mem_activations_bytes"), number(measured, "mem_peak_bytes")};
    c.planned = {planned.states.weights, planned.states.gradients, planned.states.optimizer,
                 planned.activations, planned.total()};
    // Every stage, the last (LM head, logits) included.
    const std::vector<plan::StageMemory> plans = plan::plan_memory(in);
    const io::json::Value* stages = measured.find("mem_stages");
    REQUIRE(stages != nullptr);
    REQUIRE(stages->array.size() == plans.size());
    for (std::size_t s = 0; s < plans.size(); ++s) {
        const io::json::Value& m = stages->array[s];
        const plan::StageMemory& p = plans[s];
        MemoryCompared stage;
        stage.measured = {number(m, "params_bytes"), number(m, "grads_bytes"),
                          number(m, "optimizer_bytes"), number(m, "activations_bytes"),
                          number(m, "peak_bytes")};
        stage.planned = {p.states.weights, p.states.gradients, p.states.optimizer, p.activations,
                         p.total()};
        stage.expected_params = expected_param_elements(in.cfg, static_cast<int>(s));
        c.stages.push_back(stage);
    }

    // The traffic the metrics count for rank 0's tensor and data groups, call for call (the
    // data group's with its replicas' under hybrid sharding). The planner models a LoRA run's
    // traffic as the whole model's (it says so).
    if (in.cfg.training.lora.enabled()) return c;
    const plan::StageTraffic traffic = plan::plan_traffic(in).front();
    using parallel::CommKind;
    const auto payload = [](const plan::GroupTraffic& g, CommKind kind) {
        double bytes = 0;
        for (const plan::Calls& c : g.calls)
            if (c.kind == kind)
                bytes += static_cast<double>(c.calls) * c.elements * c.element_bytes;
        return bytes;
    };
    for (const auto& [group, traffic_of] :
         {std::pair{"tp", &traffic.tensor}, std::pair{"dp", &traffic.data}})
        for (const auto& [name, kind] : {std::pair{"all_reduce", CommKind::all_reduce},
                                         std::pair{"all_gather", CommKind::all_gather},
                                         std::pair{"reduce_scatter", CommKind::reduce_scatter}}) {
            const std::string key = std::string(group) + "_" + name + "_bytes";
            INFO(key);
            const double replicas =
                traffic_of == &traffic.data ? payload(traffic.data_replica, kind) : 0.0;
            CHECK(number(measured, key.c_str()) == payload(*traffic_of, kind) + replicas);
        }
    // The pipeline group's sends and the embedding group's sum of a tied wte's two copies.
    CHECK(number(measured, "pp_send_bytes") == payload(traffic.pipeline, CommKind::send));
    CHECK(number(measured, "emb_all_reduce_bytes") ==
          payload(traffic.embedding, CommKind::all_reduce));
    // The expert group's all-to-alls (exact where every rank's experts receive alike).
    CHECK(number(measured, "ep_all_to_all_bytes") == payload(traffic.expert, CommKind::all_to_all));
    // And the data group's calls (ZeRO-3: a unit's gathers per use, or one a step).
    for (const auto& [name, kind] : {std::pair{"all_gather", CommKind::all_gather},
                                     std::pair{"reduce_scatter", CommKind::reduce_scatter}}) {
        int64_t calls = 0;
        for (const plan::Calls& c : traffic.data.calls)
            if (c.kind == kind) calls += c.calls;
        const std::string key = std::string("dp_") + name + "_calls";
        INFO(key);
        CHECK(number(measured, key.c_str()) == calls);
    }
    return c;
}

// The small config's runs: every buffer a multiple of 64 bytes, so every figure to the byte.
// Every stage's weights hold the elements counted from the shapes, but for the padding that
// aligns each ZeRO unit (a layer, the embedding, ln_f) to the D·C replicas.
void check_parameter_count(const MemoryCompared& stage, int replicas, double weight_bytes,
                           int zero_stage) {
    const double held = stage.measured.params / weight_bytes * (zero_stage >= 3 ? replicas : 1);
    const double units = 4 + 4;  // layers of the small config, wte, wpe, ln_f and the total
    INFO("parameters: " << held << " held, " << stage.expected_params << " counted");
    CHECK(held >= static_cast<double>(stage.expected_params));
    CHECK(held < static_cast<double>(stage.expected_params) + units * replicas);
}

// The plan's peak against the measured one: equal, or (ZeRO-2 and 3) not above it.
enum class Peak { planned, above_plan };

void check_stages(const std::vector<std::string>& overrides, int ranks, Peak peak) {
    cli::Workspace ws;
    const MemoryCompared c =
        measure_memory(small_config(ws), ws.path("metrics.jsonl"), overrides, ranks);
    const config::Config cfg = config::load(small_config(ws), overrides, config::Purpose::plan);
    for (std::size_t s = 0; s < c.stages.size(); ++s) {
        const MemoryCompared& stage = c.stages[s];
        INFO("stage " << s);
        CHECK(stage.measured.params == stage.planned.params);
        CHECK(stage.measured.grads == stage.planned.grads);
        CHECK(stage.measured.optimizer == stage.planned.optimizer);
        CHECK(stage.measured.activations == stage.planned.activations);
        if (peak == Peak::planned)
            CHECK(stage.measured.peak == stage.planned.peak);
        else
            CHECK(stage.measured.peak >= stage.planned.peak);
        check_parameter_count(stage, cfg.parallel.shard_ranks(),
                              plan::weight_bytes(cfg.training.precision), cfg.parallel.zero_stage);
    }
    CHECK(c.measured.peak == c.stages.front().measured.peak);  // rank 0 is stage 0's first
}

void check_measured_memory(const std::vector<std::string>& overrides, int ranks) {
    check_stages(overrides, ranks, Peak::planned);
}

// LoRA of rank 2 on its default targets over a 4-bit base in blocks of 16 (model/nf4_base.h):
// the model `model` (overrides of model.*) saved by one process after a step is the base that
// `overrides` of it train (under mpirun when `ranks` > 1). Every stage's weights (the dense
// buffer, the codes and constants, the tile), gradients, optimizer state and activations (the
// adapters' included) are the plan's to the byte.
void check_nf4_memory(const std::vector<std::string>& model,
                      const std::vector<std::string>& overrides, int ranks) {
    cli::Workspace ws;
    const auto saved = cli::run_shell(
        std::string(TRIDENT_BINARY) + " train --config " + small_config(ws) + set_flags(model) +
        " --set training.steps=1 --set checkpoint.interval=1 --set checkpoint.dir=" +
        ws.path("base"));
    INFO(saved.output);
    REQUIRE(saved.exit_code == 0);
    std::vector<std::string> all = model;
    all.insert(all.end(), {"model.init_from=" + ws.path("base"), "training.lora.rank=2",
                           "training.lora.quantize=nf4", "training.lora.quant_block=16"});
    all.insert(all.end(), overrides.begin(), overrides.end());
    const MemoryCompared c = measure_memory(small_config(ws), ws.path("metrics.jsonl"), all, ranks);
    for (std::size_t s = 0; s < c.stages.size(); ++s) {
        INFO("stage " << s);
        CHECK(c.stages[s].measured.params == c.stages[s].planned.params);
        CHECK(c.stages[s].measured.grads == c.stages[s].planned.grads);
        CHECK(c.stages[s].measured.optimizer == c.stages[s].planned.optimizer);
        CHECK(c.stages[s].measured.activations == c.stages[s].planned.activations);
    }
}

// ZeRO-2 and 3: the shards and the optimizer state to the byte (ZeRO's Table 1 terms, of the
// unit-padded buffer), the traffic call for call; the units resident for a while (gradients
// being added into or reduced) come on top of the plan's peak, which counts ZeRO-3's
// gathered weights (two units at most, or the stage's whole weights kept through the step).
void check_measured_shards(const std::vector<std::string>& overrides, int ranks) {
    check_stages(overrides, ranks, Peak::above_plan);
}

}  // namespace

TEST_CASE("plan: parameters of the Megatron-LM 2019 series", "[plan]") {
    // Shoeybi et al., arXiv 1909.08053, Table 1: vocabulary 51200, sequence 1024.
    struct Row {
        const char* config;
        int hidden, heads, layers;
        double billions;  // as the paper states them
    };
    const Row rows[] = {{"1.2b", 1536, 16, 40, 1.2},
                        {"2.5b", 1920, 20, 54, 2.5},
                        {"4.2b", 2304, 24, 64, 4.2},
                        {"8.3b", 3072, 32, 72, 8.3}};
    for (const Row& r : rows) {
        INFO(r.config);
        const double l = r.layers, h = r.hidden, V = 51200, s = 1024;
        // The count Megatron states: embeddings and layers (its final LayerNorm, 2h, is left out).
        const double formula = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h));
        CHECK(std::round(formula / 1e8) / 10 == Approx(r.billions));
        const double exact = 12 * l * h * h + 13 * l * h + (V + s) * h;  // the same, expanded
        CHECK(formula == Approx(exact));
        const config::Config cfg = megatron(r.config);
        CHECK(cfg.model.hidden == r.hidden);
        CHECK(cfg.model.heads == r.heads);
        CHECK(cfg.model.layers == r.layers);
        CHECK(static_cast<double>(cfg.derived.parameters) == exact + 2 * h);
        // The tensor-parallel ranks hold it all between them, the replicated LayerNorms and
        // row-parallel biases once each (there is no vocabulary padding at 51200).
        const plan::StageMemory stage = plan::plan_memory(inputs(cfg)).front();
        const double replicated = (l * 6 + 2) * h;
        CHECK(static_cast<double>(stage.parameters) * cfg.parallel.tensor -
                  (cfg.parallel.tensor - 1) * (replicated + s * h) ==
              exact + 2 * h);
    }
}

TEST_CASE("plan: parameters of Llama-2 and Llama-3", "[plan]") {
    // Hugging Face's config.json of each (meta-llama/Llama-2-7b-hf, 13b, 70b; Meta-Llama-3-8B,
    // 70B) and the parameter counts their model cards and safetensors indexes state.
    struct Row {
        const char* name;
        int vocab, hidden, layers, heads, kv_heads, ffn;
        int64_t parameters;
    };
    const Row rows[] = {{"Llama-2 7B", 32000, 4096, 32, 32, 32, 11008, 6'738'415'616},
                        {"Llama-2 13B", 32000, 5120, 40, 40, 40, 13824, 13'015'864'320},
                        {"Llama-2 70B", 32000, 8192, 80, 64, 8, 28672, 68'976'648'192},
                        {"Llama-3 8B", 128256, 4096, 32, 32, 8, 14336, 8'030'261'248},
                        {"Llama-3 70B", 128256, 8192, 80, 64, 8, 28672, 70'553'706'496}};
    for (const Row& r : rows) {
        INFO(r.name);
        const std::string n = std::to_string(r.vocab), h = std::to_string(r.hidden);
        const config::Config cfg = config::parse(
            "model: {arch: llama}\n", "x.yaml",
            {"model.vocab_size=" + n, "model.hidden=" + h,
             "model.layers=" + std::to_string(r.layers), "model.heads=" + std::to_string(r.heads),
             "model.kv_heads=" + std::to_string(r.kv_heads),
             "model.ffn_hidden=" + std::to_string(r.ffn)},
            config::Purpose::plan);
        CHECK(cfg.derived.parameters == r.parameters);
    }
    // The configs' grids hold the same counts, the tensor ranks between them: the replicated
    // RMSNorm gains once each, less the padded vocabulary's rows of embed_tokens and lm_head
    // (128256 pads to 129024 = 126·128·M for M = 8).
    for (const char* file : {"llama3-8b", "llama3-70b"}) {
        INFO(file);
        const config::Config cfg =
            config::load(TRIDENT_SOURCE_DIR "/configs/" + std::string(file) + ".yaml", {},
                         config::Purpose::plan);
        const int64_t expected = cfg.model.layers == 32 ? 8'030'261'248 : 70'553'706'496;
        CHECK(cfg.derived.parameters == expected);
        int64_t held = 0;
        for (const plan::StageMemory& stage : plan::plan_memory(inputs(cfg)))
            held += static_cast<int64_t>(stage.parameters);
        const int64_t M = cfg.parallel.tensor, H = cfg.model.hidden;
        const int64_t replicated = (2 * int64_t{cfg.model.layers} + 1) * H;
        const int64_t padding = 2 * (cfg.derived.padded_vocab - cfg.model.vocab_size) * H;
        CHECK(held * M - (M - 1) * replicated - padding == expected);
    }
}

TEST_CASE("plan: model-state memory of ZeRO's Table 1", "[plan]") {
    // Rajbhandari et al., arXiv 1910.02054, Table 1: GB (1e9 bytes) per device of
    // mixed-precision Adam's model states, 2 + 2 + K bytes per parameter with K = 12, for
    // P_os (stage 1), P_os+g (2) and P_os+g+p (3). The paper cuts its larger figures to the
    // digits printed (4187.5 is printed 4187) and rounds the smaller ones (41.25 is 41.3).
    struct Row {
        double params;
        int dp;
        const char* os;
        const char* os_g;
        const char* os_g_p;
    };
    const Row rows[] = {
        {7.5e9, 1, "120", "120", "120"},      {7.5e9, 4, "52.5", "41.3", "30"},
        {7.5e9, 16, "35.6", "21.6", "7.5"},   {7.5e9, 64, "31.4", "16.6", "1.88"},
        {7.5e9, 256, "30.4", "15.4", "0.47"}, {7.5e9, 1024, "30.1", "15.1", "0.12"},
        {128e9, 1, "2048", "2048", "2048"},   {128e9, 4, "896", "704", "512"},
        {128e9, 16, "608", "368", "128"},     {128e9, 64, "536", "284", "32"},
        {128e9, 256, "518", "263", "8"},      {128e9, 1024, "513", "257", "2"},
        {1e12, 1, "16000", "16000", "16000"}, {1e12, 4, "7000", "5500", "4000"},
        {1e12, 16, "4750", "2875", "1000"},   {1e12, 64, "4187", "2218", "250"},
        {1e12, 256, "4046", "2054", "62.5"},  {1e12, 1024, "4011", "2013", "15.6"},
    };
    const int fp16 = plan::weight_bytes(kernels::DType::f16);
    const int fp16_grads = plan::gradient_bytes(kernels::DType::f16, false);
    for (const Row& r : rows)
        for (const auto& [stage, printed] :
             {std::pair{1, r.os}, std::pair{2, r.os_g}, std::pair{3, r.os_g_p}}) {
            const double gb =
                plan::model_states(r.params, r.dp, stage, fp16, fp16_grads).total() / 1e9;
            // One unit of the last digit printed.
            const std::string text = printed;
            const std::size_t dot = text.find('.');
            const double unit =
                std::pow(10.0, -(dot == std::string::npos ? 0.0 : double(text.size() - dot - 1)));
            const double value = std::stod(text);
            INFO(r.params << " parameters, D = " << r.dp << ", stage " << stage << ": " << gb
                          << " GB, printed " << printed);
            CHECK(gb >= value - unit / 2);
            CHECK(gb < value + unit);
        }
    // Plain data parallelism (stage 0) holds all 16 bytes per parameter.
    CHECK(plan::model_states(7.5e9, 64, 0, fp16, fp16_grads).total() == 120e9);
}

TEST_CASE("plan: hybrid sharding holds an N-th and moves two levels", "[plan]") {
    // parallel.data_shard N over D·C = 8 (docs/FORMULAS.md, "Hybrid sharding"): model states
    // as ZeRO over N ranks; per step a reduce-scatter of Ψ per microbatch and the gathers
    // within the N ranks, and one all-reduce of Ψ/N across the D·C/N shard groups.
    cli::Workspace ws;
    for (const int zero : {1, 2, 3}) {
        const std::vector<std::string> overrides = {"parallel.data=4", "parallel.context=2",
                                                    "parallel.data_shard=2",
                                                    "parallel.zero_stage=" + std::to_string(zero)};
        const config::Config cfg = config::load(small_config(ws), overrides, config::Purpose::plan);
        const plan::PlanInputs in = inputs(cfg);
        const plan::StageMemory s = plan::plan_memory(in).front();
        const double psi = static_cast<double>(s.parameters), N = 2;
        INFO("ZeRO " << zero << ", Ψ = " << psi);
        CHECK(s.parameters % 2 == 0);
        const plan::ModelStates whole = plan::model_states(psi, 1, 0, 4, 4);
        CHECK(s.states.optimizer == whole.optimizer / N);
        CHECK(s.states.gradients == (zero >= 2 ? whole.gradients / N : whole.gradients));
        CHECK(s.states.weights == (zero >= 3 ? whole.weights / N : whole.weights));
        const plan::StageTraffic t = plan::plan_traffic(in).front();
        CHECK(t.data.size == 2);
        CHECK(t.data_replica.size == 4);
        double scattered = 0, summed = 0;
        for (const plan::Calls& c : t.data.calls)
            if (c.kind == parallel::CommKind::reduce_scatter)
                scattered += static_cast<double>(c.calls) * c.elements;
        for (const plan::Calls& c : t.data_replica.calls) {
            CHECK(c.kind == parallel::CommKind::all_reduce);
            summed += static_cast<double>(c.calls) * c.elements;
        }
        const double m = zero >= 2 ? cfg.derived.grad_accum_steps : 1;
        CHECK(scattered == m * psi);
        CHECK(summed == psi / N);
        // Ring all-reduce: 2(n−1)/n of the buffer sent, n = D·C/N = 4.
        CHECK(t.data_replica.sent_bytes() == Approx(2.0 * 3 / 4 * psi / N * 4));
    }
}

// The first and the last stage sum a tied embedding's gradient (the embedding's copy and the LM
// head's); an untied model, Llama's by default, and adapters over a frozen wte sum nothing.
TEST_CASE("plan: the embedding group's sum is a tied embedding's only", "[plan]") {
    const auto embedding_bytes = [](const std::string& config, std::vector<std::string> sets) {
        sets.push_back("parallel.pipeline=2");
        const config::Config cfg =
            config::load(TRIDENT_SOURCE_DIR "/configs/" + config, sets, config::Purpose::plan);
        double bytes = 0;
        for (const plan::StageTraffic& t : plan::plan_traffic(inputs(cfg)))
            for (const plan::Calls& c : t.embedding.calls)
                bytes += static_cast<double>(c.calls) * c.elements * c.element_bytes;
        return bytes;
    };
    const double wte = 50304.0 * 256 * 4;  // padded vocabulary x hidden, fp32 gradients
    CHECK(embedding_bytes("default.yaml", {}) == 2 * wte);  // both stages
    CHECK(embedding_bytes("llama-small-cpu.yaml", {}) == 0);
    CHECK(embedding_bytes("llama-small-cpu.yaml", {"model.tie_embeddings=true"}) == 2 * wte);
    CHECK(embedding_bytes("kjv-lora.yaml", {}) == 0);
    CHECK(embedding_bytes("llama3-70b.yaml", {}) == 0);
}

TEST_CASE("plan: bytes per element by precision", "[plan]") {
    using kernels::DType;
    CHECK(plan::weight_bytes(DType::f32) == 4);
    CHECK(plan::weight_bytes(DType::bf16) == 2);
    CHECK(plan::gradient_bytes(DType::f32, false) == 4);
    CHECK(plan::gradient_bytes(DType::f16, false) == 2);
    CHECK(plan::gradient_bytes(DType::bf16, true) == 4);
    CHECK(plan::activation_bytes(DType::f16) == 2);
    CHECK(plan::activation_bytes(DType::f32) == 4);
}

TEST_CASE("plan: activations per layer in Korthikanti et al.'s terms", "[plan]") {
    // One stage, one microbatch: the difference between recompute modes is the layers' part.
    const double s = 1024, b = 8, h = 1536, a = 16, l = 40;
    const auto activations = [&](const char* recompute,
                                 const std::vector<std::string>& extra = {}) {
        std::vector<std::string> overrides = {std::string("training.recompute=") + recompute};
        overrides.insert(overrides.end(), extra.begin(), extra.end());
        return plan::plan_memory(inputs(megatron("1.2b", overrides))).front().activations;
    };
    // The attention probabilities: 2·a·s²·b bytes a layer in 16-bit.
    CHECK(activations("none") - activations("selective") == l * 2 * a * s * s * b);
    // The rest of what a layer keeps, less its output: 30·s·b·h in 16-bit (of the 32·s·b·h
    // with the output), and LayerNorm's mean and rstd twice, fp32: 16·s·b.
    CHECK(activations("selective") - activations("full") == l * (30 * s * b * h + 16 * s * b));
    // Tensor parallelism over t = 4 without sequence parallelism: s·b·h·(8 + 24/t) + 2·a·s²·b/t.
    const double t = 4;
    const std::vector<std::string> tp = {"parallel.tensor=4"};
    CHECK(activations("none", tp) - activations("full", tp) ==
          l * ((6 + 24 / t) * s * b * h + 2 * a * s * s * b / t + 16 * s * b));
}

TEST_CASE("plan: activation sets in flight follow the schedule", "[plan]") {
    cli::Workspace ws;
    const std::string config = small_config(ws);
    const auto sets = [&](const std::vector<std::string>& overrides) {
        std::vector<int> per_stage;
        for (const plan::StageMemory& s :
             plan::plan_memory(inputs(config::load(config, overrides, config::Purpose::plan))))
            per_stage.push_back(s.activation_sets);
        return per_stage;
    };
    // 4 microbatches on 2 stages: 1F1B holds min(m, P − stage), GPipe all m.
    CHECK(sets({"parallel.pipeline=2"}) == std::vector<int>{2, 1});
    CHECK(sets({"parallel.pipeline=2", "parallel.schedule=gpipe"}) == std::vector<int>{4, 4});
    CHECK(sets({"parallel.pipeline=4", "training.global_batch=16"}) ==
          std::vector<int>{4, 3, 2, 1});
    // Interleaved: the model pools sets per chunk, so a stage allocates each chunk's own peak
    // in flight, which together can exceed the simulator's peak of (microbatch, chunk) pairs.
    const auto sim = pipeline::simulate(pipeline::Kind::interleaved, 2, 2, 4);
    const std::vector<int> interleaved =
        sets({"parallel.pipeline=2", "parallel.schedule=interleaved", "parallel.virtual_stages=2"});
    CHECK(interleaved == std::vector<int>{6, 4});
    CHECK(interleaved[0] >= sim.stages[0].peak_in_flight);
    CHECK(interleaved[1] >= sim.stages[1].peak_in_flight);
}

TEST_CASE("plan: measured memory of one-process runs is the plan, to the byte", "[plan]") {
    SECTION("ZB-H1, full recompute") {
        check_measured_memory({"parallel.schedule=zb-h1", "training.recompute=full"}, 1);
    }
    // In a section of its own: code outside every section runs again with each of them.
    SECTION("recompute none, selective, full") {
        for (const char* recompute : {"none", "selective", "full"}) {
            INFO("recompute " << recompute);
            check_measured_memory({std::string("training.recompute=") + recompute}, 1);
        }
    }
    SECTION("bf16") {
        check_measured_memory({"training.precision=bf16"}, 1);
    }
    SECTION("fp16, full recompute") {
        check_measured_memory({"training.precision=fp16", "training.recompute=full"}, 1);
    }
    SECTION("bf16, fp32 gradients") {
        check_measured_memory({"training.precision=bf16", "training.fp32_grad_accumulation=true"},
                              1);
    }
    // Muon's state: the master weights, its momentum for the layer matrices and AdamW's
    // moments for the rest (optim/muon.h), 8 and 12 bytes per parameter.
    SECTION("muon") {
        check_measured_memory({"optimizer.name=muon"}, 1);
    }
    // GaLore's: the master weights and AdamW's moments for the rest, 4 and 12 bytes per
    // parameter, and per layer matrix its projected moments and projector (optim/galore.h).
    SECTION("galore") {
        check_measured_memory({"optimizer.name=galore", "optimizer.galore.rank=4"}, 1);
    }
    // Packed documents: each set's starts and positions (model/documents.h), declared.
    SECTION("documents: mask") {
        check_measured_memory({"data.documents=mask", "data.eod_token=3"}, 1);
    }
    // LoRA over a 4-bit base (model/nf4_base.h): the codes and constants, and the tile, in the
    // parameters; with and without double quantization, GPT-2 and llama.
    SECTION("lora over a 4-bit base") {
        for (const char* dq : {"true", "false"}) {
            INFO("double quantization " << dq);
            check_nf4_memory({}, {std::string("training.lora.double_quant=") + dq}, 1);
        }
        check_nf4_memory({"model.arch=llama", "model.kv_heads=2"}, {}, 1);
    }
}

// Under mpirun (8 and 4 processes): hidden from the default test list, run by ctest as
// mpi.plan.memory with the other multi-rank tests' lock.
TEST_CASE("plan: measured memory of multi-rank runs is the plan, to the byte", "[.][plan][mpi]") {
    SECTION("2 x 2 x 2, 1F1B, sequence parallel, ZeRO-1") {
        check_measured_memory({"parallel.pipeline=2", "parallel.tensor=2", "parallel.data=2",
                               "parallel.sequence_parallel=true"},
                              8);
    }
    SECTION("2 x 1 x 2, interleaved, full recompute, ZeRO-0") {
        check_measured_memory(
            {"parallel.pipeline=2", "parallel.data=2", "parallel.schedule=interleaved",
             "parallel.virtual_stages=2", "parallel.zero_stage=0", "training.recompute=full"},
            4);
    }
    SECTION("2 x 2 x 1, ZB-H1 (what B keeps for W), sequence parallel") {
        check_measured_memory({"parallel.pipeline=2", "parallel.tensor=2",
                               "parallel.schedule=zb-h1", "parallel.sequence_parallel=true"},
                              4);
    }
    // Muon's groups per stage and tensor rank: each rank's layer matrices 8 bytes a parameter.
    SECTION("muon, 2 x 2 x 1, sequence parallel") {
        check_measured_memory({"optimizer.name=muon", "parallel.pipeline=2", "parallel.tensor=2",
                               "parallel.sequence_parallel=true"},
                              4);
    }
    // ZeRO-1 over D = 2: the replicas' halves of a stage hold different shares of layer
    // matrices (stage 0's first half holds the embedding), counted as the buckets cut them.
    SECTION("muon, 2 x 1 x 2, ZeRO-1") {
        check_measured_memory({"optimizer.name=muon", "parallel.pipeline=2", "parallel.data=2",
                               "parallel.zero_stage=1"},
                              4);
    }
    // GaLore's per-matrix state on the owners: rank 0 of a stage steps matrices 0, S·M, ...
    SECTION("galore, 2 x 2 x 1") {
        check_measured_memory({"optimizer.name=galore", "optimizer.galore.rank=4",
                               "parallel.pipeline=2", "parallel.tensor=2"},
                              4);
    }
    // A 4-bit base's shards: each tensor rank's slices of the whole matrices' codes.
    SECTION("lora over a 4-bit base, llama, 2 x 2 x 1, sequence parallel") {
        check_nf4_memory(
            {"model.arch=llama", "model.kv_heads=2", "model.dropout=0"},
            {"parallel.pipeline=2", "parallel.tensor=2", "parallel.sequence_parallel=true"}, 4);
    }
    // Expert parallelism over E = 2 of D = 2 on a llama whose every token chooses all 16 experts
    // (top_k = experts): every rank's experts receive alike, so the all-to-alls' payload is the
    // plan's to the byte (docs/FORMULAS.md); a dense first layer exchanges nothing. Sixteen experts
    // make every buffer of an MoE layer's activation set a multiple of 64 bytes (its load and the
    // counts received, 16 of each), so the activations are the plan's to the byte too; of the
    // scratch, the router's statistics (2·16 + 2 floats, 136 bytes) are the one buffer the
    // allocator rounds up, by 56 bytes.
    const std::vector<std::string> moe = {
        "model.arch=llama",   "model.kv_heads=2",        "model.dropout=0", "model.moe.experts=16",
        "model.moe.top_k=16", "model.moe.ffn_hidden=32", "parallel.data=2", "parallel.expert=2"};
    const double rounded_stats = 56;
    // The activations exactly; the peak the plan's and the statistics' rounding (ZeRO-2 and 3:
    // not below the plan, the gathers and the reduce-scatters' buffers come and go).
    const auto check_activations = [&](const MemoryCompared& c, bool exact_peak) {
        for (const MemoryCompared& stage : c.stages) {
            CHECK(stage.measured.activations == stage.planned.activations);
            if (exact_peak)
                CHECK(stage.measured.peak == stage.planned.peak + rounded_stats);
            else
                CHECK(stage.measured.peak >= stage.planned.peak);
        }
    };
    // Recompute on layers of both kinds: one scratch, as large as the MoE layer's rebuilt
    // buffers (model/activation_store.h).
    SECTION("moe, 1 x 1 x 2, E = 2, a dense first layer, and full recompute") {
        for (const std::vector<std::string>& extra : std::vector<std::vector<std::string>>{
                 {"model.moe.first_dense=1"},
                 {"training.recompute=full"},
                 {"model.moe.first_dense=1", "training.recompute=full"},
                 {"model.moe.first_dense=1", "training.recompute=selective"}}) {
            INFO(extra.front() << (extra.size() > 1 ? ", " + extra.back() : ""));
            cli::Workspace ws;
            std::vector<std::string> overrides = moe;
            overrides.insert(overrides.end(), extra.begin(), extra.end());
            check_activations(
                measure_memory(small_config(ws), ws.path("metrics.jsonl"), overrides, 2), true);
        }
    }
    // The experts split at ZeRO 1 to 3 (at 2 and 3 a run of the experts held is a unit of its
    // own, model/flat_buffer.h, sharded over the expert-shard ranks: here the rank alone, the rest
    // over D = 2): the weights, gradients and optimizer state the plan's to the byte.
    const auto check_states = [&](const std::vector<std::string>& extra, bool exact_peak,
                                  int ranks = 2) {
        cli::Workspace ws;
        std::vector<std::string> overrides = moe;
        overrides.insert(overrides.end(), extra.begin(), extra.end());
        const MemoryCompared c =
            measure_memory(small_config(ws), ws.path("metrics.jsonl"), overrides, ranks);
        const MemoryCompared& stage = c.stages.front();
        CHECK(stage.measured.params == stage.planned.params);
        CHECK(stage.measured.grads == stage.planned.grads);
        CHECK(stage.measured.optimizer == stage.planned.optimizer);
        check_activations(c, exact_peak);
    };
    SECTION("moe, 1 x 1 x 2, E = 2, ZeRO 1 to 3") {
        for (const int zero : {1, 2, 3}) {
            INFO("ZeRO-" << zero);
            check_states({"parallel.zero_stage=" + std::to_string(zero)}, zero == 1);
        }
    }
    // A matrix optimizer with the experts split: the rest's matrices take turns over D = 2, each
    // rank's experts' over its expert-shard group (the rank alone), GaLore's per-matrix state on
    // their owners (optim/matrix_exchange.h); Muon's momentum per element.
    SECTION("galore and muon, 1 x 1 x 2, E = 2, ZeRO 1 and 3") {
        for (const char* optimizer : {"optimizer.name=galore", "optimizer.name=muon"})
            for (const int zero : {1, 3}) {
                INFO(optimizer << ", ZeRO-" << zero);
                check_states({optimizer, "parallel.zero_stage=" + std::to_string(zero),
                              "optimizer.galore.rank=4"},
                             zero == 1);
            }
    }
    // Hybrid sharding over D = 4 in groups of 2: the experts split within each shard group, a
    // run of them sharded over its expert-shard ranks (N/E: the rank alone), the rest over the
    // group; a matrix optimizer's experts take their own turns there.
    SECTION("moe, galore and muon, hybrid 1 x 1 x 4 over 2, E = 2, ZeRO 1 to 3") {
        for (const char* optimizer :
             {"optimizer.name=adamw", "optimizer.name=galore", "optimizer.name=muon"})
            for (const char* zero :
                 {"parallel.zero_stage=1", "parallel.zero_stage=2", "parallel.zero_stage=3"}) {
                INFO(optimizer << ", " << zero);
                check_states({"parallel.data=4", "parallel.data_shard=2", "training.global_batch=8",
                              optimizer, zero, "optimizer.galore.rank=4"},
                             std::string(zero) == "parallel.zero_stage=1", 4);
            }
    }
    // parallel.ep_overlap: what each deferred attention's W reads waits in the shared scratch,
    // one layer's at a time, beside what selective recompute rebuilds there.
    SECTION("moe, 1 x 1 x 2, E = 2, attention weight gradients under the dispatch") {
        for (const char* recompute : {"training.recompute=none", "training.recompute=selective"}) {
            INFO(recompute);
            cli::Workspace ws;
            std::vector<std::string> overrides = moe;
            overrides.insert(overrides.end(), {"parallel.ep_overlap=true", recompute});
            check_activations(
                measure_memory(small_config(ws), ws.path("metrics.jsonl"), overrides, 2), true);
        }
    }
    // A shared expert under full recompute: an MLP's exchanges more, its input gathered again.
    SECTION("moe, 2 x 2 x 1 x 2 (P x M x C x D), E = 2, sequence parallel, a shared expert") {
        cli::Workspace ws;
        std::vector<std::string> overrides = moe;
        overrides.insert(overrides.end(),
                         {"parallel.pipeline=2", "parallel.tensor=2",
                          "parallel.sequence_parallel=true", "model.moe.shared_experts=1"});
        check_activations(measure_memory(small_config(ws), ws.path("metrics.jsonl"), overrides, 8),
                          true);
        overrides.push_back("training.recompute=full");
        check_activations(measure_memory(small_config(ws), ws.path("metrics.jsonl"), overrides, 8),
                          true);
    }
    // ZeRO-3 shards the 4-bit base's codes and constants by layers (model/nf4_base.h): each
    // rank's share of every layer's, over D = 2 and over hybrid sharding's groups of 2.
    SECTION("llama over a 4-bit base, ZeRO-3: 1 x 1 x 2 and hybrid 1 x 1 x 4 over 2") {
        const std::vector<std::string> llama = {"model.arch=llama", "model.kv_heads=2"};
        check_nf4_memory(llama, {"parallel.data=2", "parallel.zero_stage=3"}, 2);
        check_nf4_memory(llama,
                         {"parallel.data=4", "parallel.data_shard=2", "parallel.zero_stage=3",
                          "training.global_batch=8"},
                         4);
    }
    SECTION("2 x 1 x 1, ZB-H2") {
        check_measured_memory({"parallel.pipeline=2", "parallel.schedule=zb-h2"}, 2);
    }
    SECTION("llama, 2 x 1 x 1, untied and tied") {
        for (const char* tied : {"false", "true"}) {
            INFO("model.tie_embeddings " << tied);
            check_measured_memory(
                {"model.arch=llama", "model.kv_heads=2", "model.dropout=0", "parallel.pipeline=2",
                 std::string("model.tie_embeddings=") + tied},
                2);
        }
    }
    SECTION("llama, 1 x 2 x 1, sequence parallel (RMSNorm: one gradient per norm)") {
        check_measured_memory({"model.arch=llama", "model.kv_heads=2", "model.dropout=0",
                               "parallel.tensor=2", "parallel.sequence_parallel=true"},
                              2);
    }
    SECTION("1 x 1 x 2, ZeRO-2, gradients reduced every microbatch") {
        check_measured_shards({"parallel.data=2", "parallel.zero_stage=2"}, 2);
    }
    SECTION("1 x 1 x 2, ZeRO-3, whole gradients until the last microbatch") {
        check_measured_shards(
            {"parallel.data=2", "parallel.zero_stage=3", "parallel.sharded_accumulation=false"}, 2);
    }
    SECTION("1 x 1 x 4, hybrid sharding over 2, ZeRO-1") {
        check_measured_memory({"parallel.data=4", "parallel.data_shard=2"}, 4);
    }
    SECTION("1 x 1 x 4, hybrid sharding over 2, ZeRO-3") {
        check_measured_shards({"parallel.data=4", "parallel.data_shard=2", "parallel.zero_stage=3"},
                              4);
    }
    SECTION("2 x 1 x 2, ZeRO-2, tied (GPT-2) and untied (llama)") {
        check_measured_shards({"parallel.pipeline=2", "parallel.data=2", "parallel.zero_stage=2"},
                              4);
        check_measured_shards({"parallel.pipeline=2", "parallel.data=2", "parallel.zero_stage=2",
                               "model.arch=llama", "model.kv_heads=2", "model.dropout=0"},
                              4);
    }
    SECTION("2 x 1 x 2, ZeRO-3, ZB-H1, resharded after every use and kept through the step") {
        for (const char* reshard : {"true", "false"}) {
            INFO("reshard_after_forward " << reshard);
            check_measured_shards({"parallel.pipeline=2", "parallel.data=2",
                                   "parallel.zero_stage=3", "parallel.schedule=zb-h1",
                                   std::string("parallel.reshard_after_forward=") + reshard},
                                  4);
        }
    }
    SECTION("1 x 1 x 2 at 16 layers: ZeRO 1, 2, 3 peaks under upper bounds") {
        // At 16 layers the shards' savings outweigh the units held whole for a while (at the
        // 4 layers of the other sections ZeRO-2's peak is above ZeRO-1's). The allocator's
        // peak of each stage is held under the plan's total plus a few layers' units resident
        // at once (ZeRO-2: gradients being summed and reduced; ZeRO-3: weights gathered too):
        // a stage that allocated a whole buffer of gradients or weights would exceed it.
        const double H = 32, F = 128;
        const double unit = 4 * (4 * H * H + 2 * H * F + 9 * H + F);  // a layer's fp32 bytes
        std::array<double, 4> peak{};
        for (int zero : {1, 2, 3}) {
            cli::Workspace ws;
            const MemoryCompared c = measure_memory(small_config(ws), ws.path("metrics.jsonl"),
                                                    {"model.layers=16", "parallel.data=2",
                                                     "parallel.zero_stage=" + std::to_string(zero)},
                                                    2);
            peak[zero] = c.measured.peak;
            const double resident = zero == 1 ? 0 : zero == 2 ? 3 * unit : 5 * unit;
            INFO("ZeRO-" << zero << ": peak " << c.measured.peak << " bytes, plan "
                         << c.planned.peak << " + " << resident);
            CHECK(c.measured.peak <= c.planned.peak + resident);
        }
        CHECK(peak[3] < peak[2]);
        CHECK(peak[2] < peak[1]);
    }
    // Sequences of 32 and 64: each rank's token positions (T/C, int32) fill 64 bytes.
    SECTION("1 x 1 x 2 x 2 (P x M x C x D), ring attention, selective recompute, ZeRO-1") {
        check_measured_memory({"model.seq_len=32", "parallel.context=2", "parallel.data=2",
                               "training.recompute=selective"},
                              4);
    }
    SECTION("1 x 2 x 2 x 1, Ulysses, sequence parallel") {
        check_measured_memory({"model.seq_len=32", "parallel.tensor=2", "parallel.context=2",
                               "parallel.context_mode=ulysses", "parallel.sequence_parallel=true"},
                              4);
    }
    SECTION("1 x 1 x 2 x 1, ring attention within packed documents, 1F1B over P = 2") {
        check_measured_memory({"model.seq_len=32", "parallel.context=2", "parallel.pipeline=2",
                               "data.documents=mask", "data.eod_token=3"},
                              4);
    }
    SECTION("1 x 1 x 4 x 1, ring attention, full recompute") {
        check_measured_memory({"model.seq_len=64", "parallel.context=4", "training.recompute=full"},
                              4);
    }
}

TEST_CASE("plan: buffers the allocator rounds up exceed the plan by under 64 bytes each",
          "[plan]") {
    // Odd sizes (hidden 36, ffn 140, sequence 15, micro batch 3): most buffers are not a
    // multiple of 64 bytes, and the allocator adds up to 63 bytes to each.
    cli::Workspace ws;
    const std::string config = ws.write(
        "odd.yaml",
        "model: {vocab_size: 64, seq_len: 15, layers: 4, hidden: 36, heads: 4, ffn_hidden: 140}\n"
        "training: {micro_batch: 3, global_batch: 6, steps: 2, warmup_steps: 1, threads: 1}\n"
        "logging: {metrics: " +
            ws.path("odd.jsonl") +
            "}\n"
            "data: {train: " +
            ws.path("train.bin") + "}\n");
    const MemoryCompared c = measure_memory(config, ws.path("odd.jsonl"), {}, 1);
    // The buffers behind each figure on one process (model/gpt.cpp, optim/adamw.cpp):
    // the optimizer's master weights, m and v; the one activation set's token ids (2), input,
    // 13 per layer (ln1, its mean and rstd, qkv, attention probabilities, attention output,
    // resid2, ln2, its mean and rstd, fc1, GELU, output) and the head's 7 (final LayerNorm, its
    // mean and rstd, logits, loss statistics, lse, losses); and for the peak besides those, the
    // parameters, gradients, the model's 8 backward scratch buffers and the CPU backend's
    // attention-gradient workspace.
    const int optimizer_buffers = 3, activation_buffers = 3 + 4 * 13 + 7;
    const int peak_buffers = 2 + optimizer_buffers + activation_buffers + 8 + 1;
    const auto within = [](double measured, double planned, int buffers) {
        INFO("measured " << measured << ", planned " << planned << ", " << buffers << " buffers");
        CHECK(measured > planned);  // rounded up here, or the case shows nothing
        CHECK(measured - planned <= 63.0 * buffers);
    };
    CHECK(c.measured.params == c.planned.params);  // the buffers' own sizes, not allocations
    CHECK(c.measured.grads == c.planned.grads);
    within(c.measured.optimizer, c.planned.optimizer, optimizer_buffers);
    within(c.measured.activations, c.planned.activations, activation_buffers);
    within(c.measured.peak, c.planned.peak, peak_buffers);
}

TEST_CASE("plan: Megatron-LM 2019 weak scaling (Figure 5) on DGX-2H", "[plan]") {
    // Shoeybi et al., arXiv 1909.08053, Figure 5: weak-scaling efficiency against 1.2B on one
    // V100 (39 TFLOP/s), model parallel with batch 8, and model + data parallel (64 replicas,
    // global batch 512). The paper's data-parallel all-reduce was overlapped with the
    // backward, as Trident's is (parallel.overlap_grad_reduce): after it, the 512-GPU run
    // would spend 0.34 s of a 1.2 s step reducing 2 GB of gradients per GPU over 100 GB/s of
    // network per node, and could not reach the 74% the paper reports.
    struct Row {
        const char* config;
        int gpus_model, gpus_model_data;
        double model_parallel, model_data_parallel;  // % as the paper reports them
        bool held;  // the model + data parallel figure held to 5 points
    };
    // Held: every model-parallel figure (77% at 8-way among them) and the model + data
    // parallel figures at 64 and 512 GPUs (74% at 512). Reported, not held: the 2-way and
    // 4-way model + data parallel runs, which lose 12 and 3 points to their model-parallel
    // runs in the paper while the 8-way run loses 3 with 3.3x the 2-way run's gradient bytes
    // per node: no bandwidth, latency or overlap assumption gives both, and the model is
    // 11.6 and 6.2 points off there (docs/PERF.md).
    const Row rows[] = {{"1.2b", 1, 64, 100, 96, true},
                        {"2.5b", 2, 128, 95, 83, false},
                        {"4.2b", 4, 256, 82, 79, false},
                        {"8.3b", 8, 512, 77, 74, true}};
    const plan::Hardware hw = plan::hardware_preset("dgx2h-v100");
    const auto throughput = [&](const config::Config& cfg) {
        const plan::StepTime t = plan::predict_step(inputs(cfg), hw);
        return cfg.derived.flops_per_step / t.step / cfg.derived.world_size;
    };
    const double baseline = throughput(megatron("1.2b"));
    for (const Row& r : rows) {
        const config::Config mp = megatron(r.config);
        const config::Config mp_dp =
            megatron(r.config, {"parallel.data=64", "training.global_batch=512"});
        REQUIRE(mp.derived.world_size == r.gpus_model);
        REQUIRE(mp_dp.derived.world_size == r.gpus_model_data);
        const double model = 100 * throughput(mp) / baseline;
        const double model_data = 100 * throughput(mp_dp) / baseline;
        INFO(r.config << ": model parallel " << model << "% (paper " << r.model_parallel
                      << "%), model + data parallel " << model_data << "% (paper "
                      << r.model_data_parallel << "%)");
        CHECK(std::abs(model - r.model_parallel) <= 5);
        if (r.held)
            CHECK(std::abs(model_data - r.model_data_parallel) <= 5);
        else
            WARN(r.config << " model + data parallel: " << model_data << "% (paper "
                          << r.model_data_parallel << "%), reported, not held");
    }
}

TEST_CASE("plan: the command's text and JSON", "[plan]") {
    const std::string config = TRIDENT_SOURCE_DIR "/configs/megatron-8.3b.yaml";
    const auto text =
        cli::run("plan --config " + config + " --hardware dgx2h-v100 --device-memory 32GiB");
    INFO(text.output);
    REQUIRE(text.exit_code == 0);
    CHECK(text.output.find("0-7") != std::string::npos);  // stage 0's ranks
    CHECK(text.output.find("yes (") != std::string::npos);
    CHECK(text.output.find("per step") != std::string::npos);

    const auto small = cli::run("plan --config " + config + " --device-memory 8GiB --json");
    INFO(small.output);
    REQUIRE(small.exit_code == 0);
    const io::json::Value plan = io::json::parse(small.output);
    const io::json::Value* stages = plan.find("stages");
    REQUIRE(stages != nullptr);
    REQUIRE(stages->array.size() == 1);
    const io::json::Value& stage = stages->array[0];
    CHECK(stage.find("ranks")->array.size() == 8);
    const io::json::Value* memory = stage.find("memory_bytes");
    CHECK(memory->find("fits")->boolean == false);
    CHECK(memory->find("headroom")->integer < 0);
    // Byte counts are exact integers: 2 bytes of each of the stage's parameters.
    REQUIRE(memory->find("weights")->is_integer());
    CHECK(memory->find("weights")->integer == 2 * memory->find("parameters")->integer);
    for (const char* key : {"gradients", "optimizer", "activations", "temporary", "total"})
        CHECK(memory->find(key)->is_integer());
    CHECK(stage.find("layers")->integer == 72);
    CHECK(plan.find("step_time") == nullptr);  // no hardware given
}

TEST_CASE("plan: the optimizer state's file traffic and the I/O-bound verdict", "[plan]") {
    // optimizer.offload: nvme reads and writes 12 bytes (fp32 master weights, m, v) per owned
    // parameter each way a step, at the disk's bandwidth (docs/PERF.md, "Optimizer state
    // offloaded to a file").
    const std::string plan = "plan --config " TRIDENT_SOURCE_DIR
                             "/configs/gpt2-124m.yaml --hardware dgx-h100 --json "
                             "--set optimizer.offload=nvme --set optimizer.offload_dir=/tmp";
    for (const double gbs : {2.0, 500.0}) {
        const auto out = cli::run(plan + (gbs == 2.0 ? "" : " --disk-bw 500"));
        INFO(out.output);
        REQUIRE(out.exit_code == 0);
        const io::json::Value p = io::json::parse(out.output);
        const io::json::Value& time = *p.find("step_time");
        const auto number = [&](const io::json::Value* v) {
            return v->is_integer() ? static_cast<double>(v->integer) : v->real;
        };
        const double owned = static_cast<double>(
            p.find("stages")->array[0].find("memory_bytes")->find("parameters")->integer);
        CHECK(number(time.find("hardware")->find("disk_bandwidth")) == gbs * 1e9);
        const double io = number(time.find("offload_io_s"));
        CHECK(std::abs(io - 2 * 12 * owned / (gbs * 1e9)) <= 1e-6 * io);
        // 2.99 GB each way: 1.49 s at 2 GB/s, over the 0.08 s of compute; 6 ms at 500 GB/s.
        CHECK(time.find("io_bound")->boolean == (gbs == 2.0));
        CHECK(number(time.find("optimizer_s")) >= io);
    }
    const auto text = cli::run("plan --config " TRIDENT_SOURCE_DIR
                               "/configs/gpt2-124m.yaml --hardware dgx-h100 --set "
                               "optimizer.offload=nvme --set optimizer.offload_dir=/tmp");
    INFO(text.output);
    CHECK(text.output.find("at 2.0 GB/s (assumed: one NVMe drive per rank; --disk-bw "
                           "sets it): the step is I/O-bound") != std::string::npos);
    const auto none = cli::run("plan --config " TRIDENT_SOURCE_DIR
                               "/configs/gpt2-124m.yaml --hardware dgx-h100 --json");
    CHECK(io::json::parse(none.output).find("step_time")->find("offload_io_s") == nullptr);
}

TEST_CASE("plan: bad input is named", "[plan][bad-input]") {
    cli::Workspace ws;
    const std::string plan = "plan --config " + ws.path("tiny.yaml");
    cli::require_clear_error(cli::run(plan + " --set parallel.tensor=3"),
                             "parallel.tensor (3) must divide model.heads (4)");
    cli::require_clear_error(
        cli::run(plan + " --set parallel.pipeline=3 --set parallel.stage_layers=uniform"),
        "model.layers (2) must be a multiple of parallel.pipeline");
    cli::require_clear_error(
        cli::run(plan + " --set parallel.pipeline=2 --set parallel.stage_layers=[1,2]"),
        "parallel.stage_layers: the counts add up to 3, but model.layers is 2");
    cli::require_clear_error(cli::run(plan + " --set model.hiden=64"), "unknown key");
    cli::require_clear_error(cli::run(plan + " --device-memory 80bananas"), "--device-memory");
    cli::require_clear_error(cli::run(plan + " --hardware dgx-1"), "unknown hardware 'dgx-1'");
    cli::require_clear_error(cli::run(plan + " --gemm-tflops 100"), "--inter-bw");
    cli::require_clear_error(cli::run(plan + " --zero-stage 4"), "--zero-stage");
    cli::require_clear_error(cli::run(plan + " --hardware dgx-h100 --disk-bw -1"), "--disk-bw");
    // What only this build's runtime lacks is planned, not refused.
    const auto gpu = cli::run(plan + " --set device=cuda --set training.precision=bf16");
    INFO(gpu.output);
    CHECK(gpu.exit_code == 0);
}

TEST_CASE("plan: llama's activations per layer in Korthikanti et al.'s terms", "[plan]") {
    // Llama-2 7B's layer shape with 4 query heads per key/value head, bf16, one microbatch.
    const double s = 1024, b = 2, h = 4096, a = 32, g = 8, f = 11008, l = 2;
    const auto stage = [&](const char* recompute, const std::vector<std::string>& extra = {}) {
        std::vector<std::string> overrides = {
            "model.seq_len=1024",      "model.hidden=4096",
            "model.heads=32",          "model.kv_heads=8",
            "model.ffn_hidden=11008",  "model.layers=2",
            "training.micro_batch=2",  "training.global_batch=2",
            "training.precision=bf16", std::string("training.recompute=") + recompute};
        overrides.insert(overrides.end(), extra.begin(), extra.end());
        return plan::plan_memory(inputs(config::parse("model: {arch: llama}\n", "x.yaml", overrides,
                                                      config::Purpose::plan)))
            .front();
    };
    const double sbh = s * b * h;
    // The probabilities: 2·a·s²·b bytes a layer in 16-bit, no dropout copy.
    CHECK(stage("none").activations - stage("selective").activations == l * 2 * a * s * s * b);
    // What a layer keeps besides them, less its output (full recompute's input): the RMSNorms'
    // and the column-split GEMMs' inputs 8·s·b·h, Q and the output GEMM's input 4, SwiGLU
    // 6·f/h, less 2 — and each RMSNorm's fp32 rstd, 4·s·b bytes. K and V are kept expanded to
    // the a query heads the attention core reads (4, not 4·g/a: docs/FORMULAS.md).
    const double kept = sbh * (8 + 4 + 4 + 6 * f / h - 2) + 2 * 4 * s * b;
    CHECK(stage("selective").activations - stage("full").activations == l * kept);
    // Korthikanti's figure counts the same tensors (no masks: llama has no dropout), the output
    // included, without the fp32 statistics.
    CHECK(stage("none").korthikanti ==
          l * (sbh * (12 + 4 * g / a + 6 * f / h) + 2 * a * s * s * b));
    const std::vector<std::string> tp = {"parallel.tensor=4"};
    const double t = 4;
    CHECK(stage("none", tp).korthikanti ==
          l * (sbh * (8 + (4 + 4 * g / a + 6 * f / h) / t) + 2 * a * s * s * b / t));
}

TEST_CASE("plan: Korthikanti's figure sums the layer's kinds of part", "[plan]") {
    // GPT-2's layer with other MLPs, bf16, one microbatch, no recompute.
    const double s = 256, b = 2, h = 512, a = 8, f = 1536, l = 2;
    const auto figure = [&](const std::string& mlp) {
        const std::vector<std::string> overrides = {
            "model.seq_len=256",       "model.hidden=512",        "model.heads=8",
            "model.ffn_hidden=1536",   "model.layers=2",          "training.micro_batch=2",
            "training.global_batch=2", "training.precision=bf16", "model.mlp=" + mlp};
        return plan::plan_memory(inputs(config::parse("model: {arch: gpt2}\n", "x.yaml", overrides,
                                                      config::Purpose::plan)))
            .front()
            .korthikanti;
    };
    const double sbh = s * b * h, scores = 5 * a * s * s * b;
    // The LayerNorms' inputs 4 and GPT-2's attention 3 whole, 8 split and 5·a·s/h; SwiGLU's
    // input 2 whole, gate, up and product 6·f/h.
    CHECK(figure("swiglu") == l * (sbh * (4 + 3 + 8 + 2 + 6 * f / h) + scores));
    // ReLU² counted as GELU: its input and the dropout mask 3 whole, the activation's input and
    // output 4·f/h (Korthikanti's 16 at f = 4·h).
    CHECK(figure("relu2") == l * (sbh * (4 + 3 + 8 + 3 + 4 * f / h) + scores));
    CHECK(figure("gelu") == figure("relu2"));
}

// Muon's Newton-Schulz iterations, ns_steps·(4·a²·b + 2·a³) FLOPs for a matrix of sides
// a <= b (docs/FORMULAS.md), summed over every layer matrix from the models' published shapes
// (GPT-2 124M: c_attn 768 x 2304, c_proj 768 x 768, c_fc and mlp c_proj 768 x 3072; Llama 3
// 8B: q and o 4096 x 4096, k and v 1024 x 4096, gate, up and down 14336 x 4096); in the step's
// optimizer seconds at the GEMMs' rate, spread over the M·N ranks that step them.
TEST_CASE("plan: Muon's Newton-Schulz FLOPs, each layer matrix once, in the optimizer's time",
          "[plan]") {
    const auto ns = [](double a, double b, double steps) {
        return steps * (4 * a * a * b + 2 * a * a * a);
    };
    const double gpt2 = 12 * (ns(768, 2304, 5) + ns(768, 768, 5) + 2 * ns(768, 3072, 5));
    const double llama =
        32 * (2 * ns(4096, 4096, 3) + 2 * ns(1024, 4096, 3) + 3 * ns(4096, 14336, 3));
    const auto plan = [](const std::string& config, const std::string& sets) {
        const auto out = cli::run("plan --config " TRIDENT_SOURCE_DIR "/configs/" + config +
                                  " --hardware dgx-h100 --json" + sets);
        INFO(out.output);
        REQUIRE(out.exit_code == 0);
        return io::json::parse(out.output);
    };
    const auto number = [](const io::json::Value* v) {
        return v->is_integer() ? static_cast<double>(v->integer) : v->real;
    };
    for (const auto& [config, flops, sets] :
         {std::tuple{"gpt2-124m.yaml", gpt2, std::string()},
          std::tuple{"llama3-8b.yaml", llama, std::string(" --set optimizer.muon.ns_steps=3")}}) {
        INFO(config);
        const io::json::Value muon = plan(config, " --set optimizer.name=muon" + sets);
        const io::json::Value adamw = plan(config, "");
        const double counted = number(muon.find("flops")->find("optimizer_flops_per_step"));
        CHECK(std::abs(counted - flops) <= 1e-8 * flops);
        CHECK(number(adamw.find("flops")->find("optimizer_flops_per_step")) == 0);
        CHECK(number(muon.find("flops")->find("model_flops_per_step")) ==
              number(adamw.find("flops")->find("model_flops_per_step")));
        // gpt2-124m: 1 x 1 x 1; llama3-8b: M = 2, ZeRO-1 over D = 4.
        const double ranks = std::string(config) == "gpt2-124m.yaml" ? 1 : 8;
        const double extra = number(muon.find("step_time")->find("optimizer_s")) -
                             number(adamw.find("step_time")->find("optimizer_s"));
        const double want = flops / ranks / 798e12;  // dgx-h100's GEMM rate
        CHECK(std::abs(extra - want) <= 1e-6 * want);
    }
}

// --doc-len L under data.documents: mask: the attention products (Q·Kᵀ and P·V, causal half of
// B·T·T·C·H/M each, twice as many in the backward) at L/S of a causal window's; nothing else.
TEST_CASE("plan: --doc-len counts the attention within documents", "[plan]") {
    const auto plan = [](const std::string& args) {
        return cli::run("plan --config " TRIDENT_SOURCE_DIR
                        "/configs/gpt2-124m.yaml --hardware "
                        "dgx-h100 --set data.documents=mask " +
                        args);
    };
    const auto executed = [&](const std::string& args) {
        const auto out = plan("--json " + args);
        INFO(out.output);
        REQUIRE(out.exit_code == 0);
        const io::json::Value p = io::json::parse(out.output);
        return p.find("step_time")->find("executed_flops_slowest_stage")->real;
    };
    // gpt2-124m: micro batch 4, 1024 tokens, hidden 768, 12 layers, 8 microbatches, 1 x 1 x 1.
    const double scores = 4.0 * 1024 * 1024 * 768;
    const double saved = 8 * 12 * 6 * scores * (1 - 128.0 / 1024);
    const double whole = executed(""), documents = executed("--doc-len 128");
    CHECK(std::abs(whole - documents - saved) <= 1e-6 * saved);
    CHECK(executed("--doc-len 4096") == whole);  // a document longer than the window: causal
    const auto zero = plan("--doc-len 0");
    CHECK(zero.exit_code != 0);
    CHECK(zero.output.find("--doc-len: expected a mean document length of at least 1") !=
          std::string::npos);
    const auto stream =
        cli::run("plan --config " TRIDENT_SOURCE_DIR "/configs/gpt2-124m.yaml --doc-len 128");
    CHECK(stream.exit_code != 0);
    CHECK(stream.output.find("only under data.documents: mask") != std::string::npos);
}
