// `trident export --format hf` writes a Hugging Face model folder (config.json and the weights,
// Llama's sharded above --shard-size) that model.init_from and generate --weights read back:
// the weights bitwise the checkpoint's, the config equal, the first training loss and the
// greedy text the same as from the checkpoint itself.
#include <cstring>
#include <fstream>

#include "cli_support.h"
#include "config/model_shape.h"
#include "data/token_shards.h"
#include "model/hf_llama.h"
#include "model/hf_llama_config.h"
#include "model/hf_weights.h"
#include "train/checkpoint.h"

using namespace cli;

namespace {

// A byte-level model (its text needs no tokenizer files) of 2 layers, 4 heads of 8.
// A given peak spares each run the start-up GEMM measurement.
const std::string kTraining =
    "training: {micro_batch: 2, global_batch: 4, steps: 3, warmup_steps: 1, threads: 1}\n"
    "hardware: {peak_flops: 1e12}\n";
const std::string kLlama =
    "model: {arch: llama, vocab_size: 256, seq_len: 16, layers: 2, hidden: 32, heads: 4, "
    "kv_heads: 2, ffn_hidden: 48}\n";
const std::string kGpt2 =
    "model: {vocab_size: 256, seq_len: 16, layers: 2, hidden: 32, heads: 4, ffn_hidden: 64}\n";

// Trains `model` 3 steps into checkpoint.dir ck.
void train_checkpoint(const Workspace& ws, const std::string& model) {
    std::vector<uint16_t> bytes(600);
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = "the cat sat on a mat. "[i % 22];
    trident::data::write_token_shard(ws.path("b.bin"), bytes);
    const std::string data = "data: {train: " + ws.path("b.bin") + "}\n";
    ws.write("model.yaml", model + kTraining + data + "checkpoint: {dir: " + ws.path("ck") + "}\n");
    require_ok(run("train --config " + ws.path("model.yaml")));
    // The same data and training from given weights: from a folder every model key left out,
    // from the checkpoint given.
    ws.write("from.yaml", kTraining + data);
    ws.write("from_ck.yaml", model + kTraining + data);
}

// The first step's loss of a run from `init_from` (metrics.jsonl's "%.9g": a float exactly).
std::string first_loss(const Workspace& ws, const std::string& init_from) {
    const std::string metrics = ws.path("m.jsonl");
    fs::remove(metrics);
    const bool folder = fs::exists(init_from + "/config.json");
    require_ok(run("train --config " + ws.path(folder ? "from.yaml" : "from_ck.yaml") +
                   " --set model.init_from=" + init_from +
                   " --set training.steps=1 --set logging.metrics=" + metrics));
    std::ifstream in(metrics);
    for (std::string line; std::getline(in, line);)
        if (line.find("\"step\": 1,") != std::string::npos) {
            const auto at = line.find("\"loss\": ");
            return line.substr(at, line.find(',', at) - at);
        }
    FAIL("no step 1 in " << metrics);
    return "";
}

std::string greedy_text(const std::string& source) {
    return require_ok(run("generate " + source + " --prompt the --tokens 6 --temperature 0"))
        .output;
}

}  // namespace

namespace {

// `model` (a llama) exported as a folder, whole and sharded, imports back bitwise, trains from
// the same first loss and generates the same text as its checkpoint.
void check_llama_folder(const std::string& model) {
    Workspace ws;
    train_checkpoint(ws, model);
    const std::string ck = ws.path("ck"), whole = ws.path("hf"), sharded = ws.path("hf_sharded");
    CHECK(require_ok(run("export --checkpoint " + ck + " --format hf -o " + whole))
              .output.ends_with(" -> " + whole + " (config.json, model.safetensors)\n"));
    CHECK(require_ok(
              run("export --checkpoint " + ck + " --format hf --shard-size 4096 -o " + sharded))
              .output.find(" shards and their index)") != std::string::npos);
    REQUIRE(fs::exists(sharded + "/model.safetensors.index.json"));

    const trident::train::LoadedModel loaded = trident::train::load_model_checkpoint(ck);
    const trident::model::ParamLayout layout(trident::config::gpt_shape(loaded.cfg));
    for (const std::string& dir : {whole, sharded}) {
        INFO(dir);
        std::vector<float> back(layout.total(), std::nanf(""));
        trident::model::load_hf_llama(dir, layout, back.data());
        CHECK(std::memcmp(back.data(), loaded.params.data(), back.size() * sizeof(float)) == 0);
        CHECK(trident::model::read_hf_llama_config(dir + "/config.json") ==
              trident::config::hf_llama_config(loaded.cfg));
    }
    // Training from the folder, the shape from its config.json, starts where the checkpoint's
    // weights do (the sharded folder's weights are the same bitwise, above).
    CHECK(first_loss(ws, whole) == first_loss(ws, ck));
    // generate reads a folder (sharded or not: the same reader as above), or a file with
    // config.json beside it.
    const std::string text = greedy_text("--checkpoint " + ck);
    CHECK(greedy_text("--weights " + whole) == text);
    CHECK(greedy_text("--weights " + whole + "/model.safetensors") == text);
    // Into a folder holding files, stale shards would mix two models.
    require_clear_error(run("export --checkpoint " + ck + " --format hf -o " + whole),
                        whole + " exists and is not an empty folder");
}

}  // namespace

TEST_CASE("export --format hf: a llama folder whole or sharded imports back bitwise",
          "[cli][hf_folder]") {
    check_llama_folder(kLlama);
}

TEST_CASE("export --format hf: a Qwen3 folder (qk_norm) imports back bitwise", "[cli][hf_folder]") {
    // Qwen3ForCausalLM's config.json (model_type qwen3) and its q_norm and k_norm tensors.
    const std::string qwen3 = kLlama.substr(0, kLlama.size() - 2) + ", qk_norm: true}\n";
    check_llama_folder(qwen3);
    const trident::model::HfLlamaConfig hf{256, 32,      2,    4,     2,  48,
                                           16,  10000.0, 1e-6, false, -1, true};
    const std::string json = trident::model::hf_llama_config_json(hf);
    CHECK(json.find("\"model_type\": \"qwen3\"") != std::string::npos);
    CHECK(json.find("\"Qwen3ForCausalLM\"") != std::string::npos);
    Workspace ws;
    std::string sliding = json;
    const std::string off = "\"use_sliding_window\": false";
    REQUIRE(sliding.find(off) != std::string::npos);
    sliding.replace(sliding.find(off), off.size(), "\"use_sliding_window\": true");
    ws.write("sliding.json", sliding);
    CHECK_THROWS_WITH(trident::model::read_hf_llama_config(ws.path("sliding.json")),
                      Catch::Contains("use_sliding_window is true"));
}

// The names and config.json keys of a mixture of experts' folder (model/hf_moe_config.h).
void check_moe_folder(const std::string& model, const std::vector<std::string>& names,
                      const std::vector<std::string>& keys) {
    check_llama_folder(model);
    Workspace ws;
    train_checkpoint(ws, model);
    require_ok(run("export --checkpoint " + ws.path("ck") + " --format hf -o " + ws.path("hf")));
    const std::string config = read_text(ws.path("hf/config.json"));
    for (const std::string& key : keys) CHECK_THAT(config, Catch::Contains(key));
    const auto weights = trident::model::HfWeights::open(ws.path("hf"));
    for (const std::string& name : names) CHECK(weights.find(name) != nullptr);
}

TEST_CASE(
    "export --format hf: MoE folders (Mixtral, Qwen3-MoE, DeepSeek's keys) import back "
    "bitwise",
    "[cli][hf_folder]") {
    const std::string llama = kLlama.substr(0, kLlama.size() - 2);
    SECTION("Mixtral") {
        check_moe_folder(
            llama + ", moe: {experts: 4, top_k: 2, aux_loss: 0.02}}\n",
            {"model.layers.1.block_sparse_moe.gate.weight",
             "model.layers.1.block_sparse_moe.experts.3.w1.weight",
             "model.layers.1.block_sparse_moe.experts.3.w2.weight",
             "model.layers.1.block_sparse_moe.experts.3.w3.weight"},
            {"\"model_type\": \"mixtral\"", "\"MixtralForCausalLM\"", "\"num_local_experts\": 4",
             "\"num_experts_per_tok\": 2", "\"router_aux_loss_coef\": 0.02"});
    }
    SECTION("Qwen3-MoE: narrower experts, the first layer dense, top k not normalized") {
        check_moe_folder(
            llama +
                ", qk_norm: true, moe: {experts: 4, top_k: 2, ffn_hidden: 24, "
                "normalize_top_k: false, first_dense: 1}}\n",
            {"model.layers.0.mlp.gate_proj.weight", "model.layers.1.mlp.gate.weight",
             "model.layers.1.mlp.experts.3.down_proj.weight",
             "model.layers.1.self_attn.q_norm.weight"},
            {"\"model_type\": \"qwen3_moe\"", "\"Qwen3MoeForCausalLM\"", "\"num_experts\": 4",
             "\"moe_intermediate_size\": 24", "\"norm_topk_prob\": false",
             "\"mlp_only_layers\": [0]", "\"intermediate_size\": 48"});
    }
    SECTION("DeepSeek's keys: shared experts, the sigmoid router and its bias, a scale") {
        check_moe_folder(llama +
                             ", qk_norm: true, moe: {experts: 4, top_k: 2, shared_experts: "
                             "1, router: sigmoid, scale: 2.5}}\n",
                         {"model.layers.1.mlp.shared_experts.up_proj.weight",
                          "model.layers.1.mlp.gate.e_score_correction_bias"},
                         {"\"n_shared_experts\": 1", "\"scoring_func\": \"sigmoid\"",
                          "\"routed_scaling_factor\": 2.5"});
    }
    SECTION("refused: an expert missing, dense layers between MoE layers, no q/k norms") {
        Workspace ws;
        train_checkpoint(ws, llama + ", moe: {experts: 4, top_k: 2}}\n");
        const std::string hf = ws.path("hf");
        require_ok(run("export --checkpoint " + ws.path("ck") + " --format hf -o " + hf));
        std::string config = read_text(hf + "/config.json");
        const std::string four = "\"num_local_experts\": 4";
        REQUIRE(config.find(four) != std::string::npos);
        ws.write("hf/config.json",
                 config.replace(config.find(four), four.size(), "\"num_local_experts\": 5"));
        require_clear_error(
            run("train --config " + ws.path("from.yaml") + " --set model.init_from=" + hf),
            "missing tensor model.layers.0.block_sparse_moe.experts.4.w1.weight");
        ws.write("q.json",
                 "{\"model_type\": \"qwen3_moe\", \"vocab_size\": 256, "
                 "\"hidden_size\": 32, \"num_hidden_layers\": 3, "
                 "\"num_attention_heads\": 4, \"intermediate_size\": 48, "
                 "\"num_experts\": 4, \"num_experts_per_tok\": 2, "
                 "\"mlp_only_layers\": [1]}");
        CHECK_THROWS_WITH(trident::model::read_hf_llama_config(ws.path("q.json")),
                          Catch::Contains("mlp_only_layers is not the first layers"));
        Workspace shared;
        train_checkpoint(shared, llama + ", moe: {experts: 4, top_k: 2, shared_experts: 1}}\n");
        require_clear_error(run("export --checkpoint " + shared.path("ck") + " --format hf -o " +
                                shared.path("hf")),
                            "whose attention has q_norm and k_norm");
    }
}

TEST_CASE("export --format hf: a GPT-2 folder trains and generates as its checkpoint",
          "[cli][hf_folder]") {
    Workspace ws;
    train_checkpoint(ws, kGpt2);
    const std::string ck = ws.path("ck"), dir = ws.path("hf");
    require_ok(run("export --checkpoint " + ck + " --format hf -o " + dir));
    CHECK(fs::exists(dir + "/model.safetensors"));
    std::ifstream config(dir + "/config.json");
    const std::string json{std::istreambuf_iterator<char>(config), {}};
    CHECK(json.find("\"model_type\": \"gpt2\"") != std::string::npos);
    CHECK(first_loss(ws, dir) == first_loss(ws, ck));
    CHECK(greedy_text("--weights " + dir) == greedy_text("--checkpoint " + ck));
}
