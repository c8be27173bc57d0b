// Tests of model.moe in the config: its defaults, reading and writing back, which layers are
// MoE layers, and each refusal with its message (docs/ARCHITECTURE.md, "Mixture of experts").
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/model_shape.h"

using namespace trident::config;

namespace {

const std::string kLlama = "data:\n  train: data/train.bin\nmodel:\n  arch: llama\n";

// The message of the ConfigError that a plan's parse throws; fails the test if none is.
std::string error_of(const std::vector<std::string>& overrides, const std::string& yaml = kLlama) {
    try {
        parse(yaml, "x.yaml", overrides, Purpose::plan);
    } catch (const ConfigError& e) {
        return e.what();
    }
    FAIL("expected a ConfigError");
    return "";
}

}  // namespace

TEST_CASE("config: model.moe's defaults are a dense model", "[config]") {
    const Config cfg = parse(kLlama, "x.yaml", {}, Purpose::plan);
    const MoeSettings& moe = cfg.model.moe;
    CHECK(!moe.enabled());
    CHECK(moe.top_k == 2);
    CHECK(moe.router == MoeRouter::softmax);
    CHECK(moe.normalize_top_k);
    CHECK(moe.scale == 1.0);
    CHECK(moe.aux_loss == 0.01);
    CHECK(moe.z_loss == 0.0);
    CHECK(moe.bias_update_rate == 0.0);
    CHECK(moe.first_dense == 0);
    CHECK(moe.every == 1);
    CHECK(moe.capacity_factor == 0.0);
    for (int l = 0; l < cfg.model.layers; ++l) CHECK(!moe.moe_layer(l));
}

TEST_CASE("config: model.moe reads, writes back and picks its layers", "[config]") {
    const std::string yaml = kLlama +
                             "  layers: 6\n  ffn_hidden: 96\n  moe: {experts: 8, top_k: 3, "
                             "router: sigmoid, z_loss: 0.001, shared_experts: 1, "
                             "first_dense: 1, every: 2, normalize_top_k: false, scale: 2.5}\n";
    const Config cfg = parse(yaml, "x.yaml", {}, Purpose::plan);
    const MoeSettings& moe = cfg.model.moe;
    CHECK(moe.experts == 8);
    CHECK(moe.top_k == 3);
    CHECK(moe.router == MoeRouter::sigmoid);
    CHECK(!moe.normalize_top_k);
    CHECK(moe.scale == 2.5);
    CHECK(moe.z_loss == 0.001);
    CHECK(moe.shared_experts == 1);
    // Layer i is MoE when i >= first_dense and (i + 1) % every == 0: 1, 3, 5.
    std::vector<int> moe_layers;
    for (int l = 0; l < cfg.model.layers; ++l)
        if (moe.moe_layer(l)) moe_layers.push_back(l);
    CHECK(moe_layers == std::vector<int>{1, 3, 5});
    // DeepSeek's first_k_dense_replace with every layer after it sparse.
    const Config deepseek = parse(kLlama + "  layers: 4\n  moe: {experts: 4, first_dense: 2}\n",
                                  "x.yaml", {}, Purpose::plan);
    CHECK(!deepseek.model.moe.moe_layer(1));
    CHECK(deepseek.model.moe.moe_layer(2));
    CHECK(deepseek.model.moe.moe_layer(3));
    // An expert's width defaults to model.ffn_hidden in the model's shape.
    CHECK(gpt_shape(cfg).moe.ffn_hidden == 96);
    CHECK(gpt_shape(parse(yaml, "x.yaml", {"model.moe.ffn_hidden=32"}, Purpose::plan))
              .moe.ffn_hidden == 32);
    // Written back, the map reads to the same settings.
    const Config again = parse(to_yaml(cfg), "y.yaml", {}, Purpose::plan);
    CHECK(again.model.moe == moe);
}

TEST_CASE("config: model.moe's refusals name their key", "[config]") {
    CHECK(error_of({"model.moe.experts=4", "model.moe.top_k=5"}) ==
          "--set model.moe.top_k=5: model.moe.top_k (5) must not exceed model.moe.experts (4): "
          "each token goes to top_k distinct experts");
    CHECK(error_of({"model.moe.experts=4", "model.moe.bias_update_rate=0.01"}) ==
          "--set model.moe.bias_update_rate=0.01: model.moe.bias_update_rate (0.01) needs "
          "model.moe.router: sigmoid (DeepSeek-V3's balancing biases the selection of sigmoid "
          "scores; it is softmax)");
    CHECK(error_of({"model.moe.experts=4", "model.moe.capacity_factor=-1"}) ==
          "--set model.moe.capacity_factor=-1: model.moe.capacity_factor: must be >= 0, got -1");
    CHECK(error_of({"model.moe.experts=4"}, "data:\n  train: data/train.bin\n") ==
          "--set model.moe.experts=4: model.moe.experts (4) needs model.arch: llama (it is "
          "gpt2): the experts are SwiGLU MLPs");
    CHECK(error_of({"model.moe.experts=4", "model.moe.ffn_hidden=30", "parallel.tensor=4"}) ==
          "--set parallel.tensor=4: model.moe.ffn_hidden (30) must be a multiple of "
          "parallel.tensor (4): each expert splits over the tensor ranks as the dense MLP");
    // What is not built yet.
    CHECK(error_of({"model.moe.experts=4", "model.moe.router=sigmoid",
                    "model.moe.bias_update_rate=0.001", "optimizer.offload=nvme",
                    "optimizer.offload_dir=/tmp/state"}) ==
          "--set optimizer.offload=nvme: model.moe.bias_update_rate (0.001) with "
          "optimizer.offload: nvme is not built yet: the router's bias moves in the master "
          "weights (optimizer.offload: none or host)");
    CHECK(error_of({"model.moe.experts=4", "training.loss_normalization=tokens"}) ==
          "--set training.loss_normalization=tokens: training.loss_normalization: tokens (or "
          "data.mask_eod_loss) with model.moe is not built yet: the balancing losses are averaged "
          "over microbatches");
    CHECK(error_of({"model.moe.top_k=0"}) ==
          "--set model.moe.top_k=0: model.moe.top_k: must be >= 1, got 0");
}

TEST_CASE("config: parallel.expert reads and its refusals name their key", "[config]") {
    const Config cfg =
        parse(kLlama, "x.yaml", {"model.moe.experts=4", "parallel.data=4", "parallel.expert=2"},
              Purpose::plan);
    CHECK(cfg.parallel.expert == 2);
    CHECK(parse(kLlama, "x.yaml", {}, Purpose::plan).parallel.expert == 1);
    CHECK(error_of({"parallel.data=2", "parallel.expert=2"}) ==
          "--set parallel.expert=2: parallel.expert (2) needs model.moe.experts > 0: it splits "
          "the experts of the MoE layers");
    CHECK(error_of({"model.moe.experts=4", "parallel.data=3", "parallel.expert=2",
                    "training.global_batch=12"}) ==
          "--set parallel.expert=2: parallel.expert (2) must divide parallel.data × "
          "parallel.context (3 × 1 = 3): the experts split over ranks of the data-context group");
    CHECK(error_of({"model.moe.experts=6", "parallel.data=4", "parallel.expert=4"}) ==
          "--set parallel.expert=4: model.moe.experts (6) must be a multiple of parallel.expert "
          "(4): each expert rank holds as many experts");
    // With hybrid sharding the experts split within each shard group.
    CHECK(error_of({"model.moe.experts=4", "parallel.data=4", "parallel.data_shard=2",
                    "parallel.expert=4", "training.global_batch=16"}) ==
          "--set parallel.expert=4: parallel.expert (4) must divide parallel.data_shard (2): the "
          "experts split within each shard group");
    CHECK(error_of({"model.moe.experts=4", "parallel.expert=0"}) ==
          "--set parallel.expert=0: parallel.expert: must be in [1, 65536], got 0");
    // A matrix optimizer steps the experts whole where they split (optim/matrix_exchange.h),
    // at every ZeRO stage.
    for (const char* zero : {"parallel.zero_stage=0", "parallel.zero_stage=1",
                             "parallel.zero_stage=2", "parallel.zero_stage=3"})
        for (const char* optimizer : {"optimizer.name=muon", "optimizer.name=galore"})
            CHECK_NOTHROW(parse(
                kLlama, "x.yaml",
                {"model.moe.experts=4", "parallel.data=2", "parallel.expert=2", optimizer, zero},
                Purpose::plan));
    CHECK_NOTHROW(parse(
        kLlama, "x.yaml",
        {"model.moe.experts=4", "parallel.data=4", "parallel.data_shard=2", "parallel.expert=2",
         "optimizer.name=muon", "parallel.zero_stage=3", "training.global_batch=16"},
        Purpose::plan));
}

TEST_CASE("config: LoRA on a mixture of experts adapts its attention alone", "[config]") {
    // A llama's default targets (q, v), and every attention linear, are taken.
    const Config cfg =
        parse(kLlama, "x.yaml", {"model.moe.experts=4", "training.lora.rank=4"}, Purpose::plan);
    CHECK(cfg.training.lora.enabled());
    CHECK_NOTHROW(parse(kLlama, "x.yaml",
                        {"model.moe.experts=4", "training.lora={rank: 4, targets: [q, k, v, o]}"},
                        Purpose::plan));
    // An MLP target, on any layer of the model (here the first, dense).
    CHECK(error_of({"model.moe.experts=4", "model.moe.first_dense=1",
                    "training.lora={rank: 4, targets: [q, up]}"}) ==
          "--set training.lora={rank: 4, targets: [q, up]}: training.lora.targets: up with "
          "model.moe.experts (4) is not built: a mixture of experts' adapters wrap its attention "
          "(q, k, v, o); its MLPs, experts and dense, stay frozen");
    CHECK(error_of({"model.moe.experts=4", "model.moe.router=sigmoid",
                    "model.moe.bias_update_rate=0.01", "training.lora.rank=4"}) ==
          "--set training.lora.rank=4: model.moe.bias_update_rate (0.01) with "
          "training.lora.rank > 0: the router's bias is part of the frozen base (an adapters "
          "file does not carry it); set the rate to 0");
    CHECK(error_of({"model.moe.experts=4", "training.lora={rank: 4, quantize: nf4}"}) ==
          "--set training.lora={rank: 4, quantize: nf4}: training.lora.quantize: nf4 with "
          "model.moe.experts > 0 is not built yet: the router and the experts read their weights "
          "dense");
}

TEST_CASE("config: parallel.ep_overlap needs an exchange and a plain backward", "[config]") {
    const std::vector<std::string> ep = {"model.moe.experts=4", "parallel.data=2",
                                         "parallel.expert=2", "parallel.ep_overlap=true"};
    const auto with = [&](std::vector<std::string> extra) {
        extra.insert(extra.begin(), ep.begin(), ep.end());
        return extra;
    };
    const std::string overlap =
        "parallel.ep_overlap: true (the attention weight gradients of the layer above under "
        "each MoE layer's dispatch)";
    CHECK(error_of({"model.moe.experts=4", "parallel.ep_overlap=true"}) ==
          "--set parallel.ep_overlap=true: " + overlap +
              " needs parallel.expert > 1: without expert parallelism nothing travels");
    CHECK(error_of(with({"parallel.pipeline=2", "parallel.schedule=zb-h1"})) ==
          "--set parallel.schedule=zb-h1: " + overlap +
              " with parallel.schedule: zb-h1 is not built: a zero-bubble schedule runs every "
              "weight gradient apart already");
    CHECK(error_of(with({"training.recompute=full"})) ==
          "--set training.recompute=full: " + overlap +
              " with training.recompute: full is not built: the layer below's rerun rebuilds its "
              "activations where the attention's wait");
    CHECK(error_of(with({"training.lora.rank=4"})) ==
          "--set training.lora.rank=4: " + overlap +
              " with training.lora is not built: the adapters' weight gradients run with their "
              "layer's backward");
}
