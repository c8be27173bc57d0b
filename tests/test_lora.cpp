// Low-rank adapters (training.lora) in one process: with B = 0 the adapted model is the model,
// the frozen weights never change, memory holds the weights and the adapters' training state
// only, recompute trains the adapters bitwise as without it, and the gradients through the
// adapters' dropout are the loss's (finite differences). The layouts' equality, the
// PyTorch reference and the files are tests/python/test_lora.py's.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/model_shape.h"
#include "io/safetensors.h"
#include "kernels/error.h"
#include "kernels/ops.h"
#include "kernels/random.h"
#include "model/lora.h"
#include "solo_grid.h"
#include "temp_dir.h"
#include "train/checkpoint_manifest.h"
#include "train/trainer.h"

using namespace trident;

namespace {

// 2 layers, H = 32, F = 128, V = 100 (Vp = 128), N = 2·16 rows per microbatch.
config::Config lora_config(int rank, const std::string& recompute = "none",
                           const std::string& precision = "fp32", double dropout = 0.1) {
    return config::parse(
        "model: {vocab_size: 100, seq_len: 16, layers: 2, hidden: 32, heads: 4, ffn_hidden: "
        "128, init_from: unused.safetensors}\n"
        "training: {micro_batch: 2, global_batch: 4, steps: 4, warmup_steps: 1, threads: 2,\n"
        "           lr: 1.0e-2, recompute: " +
            recompute + ", precision: " + precision + ",\n           lora: {rank: " +
            std::to_string(rank) + ", alpha: 8, dropout: " + std::to_string(dropout) +
            "}}\n"
            "data: {train: unused.bin}\n",
        "lora.yaml");
}

const train::SampleFn kTokens = [](uint64_t k, std::span<int32_t> in, std::span<int32_t> tgt) {
    for (std::size_t i = 0; i < in.size(); ++i) {
        in[i] = static_cast<int32_t>(kernels::hash64(k % 3, i) % 100);
        tgt[i] = static_cast<int32_t>(kernels::hash64(k % 3, i + 1) % 100);
    }
};

// The message of the trident::Error that fn throws ("" if none).
template <typename Fn>
std::string error_of(Fn fn) {
    try {
        fn();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

// The same weights for every trainer; under adapters, A from the seed and B = 0.
void initialise(train::Trainer& trainer, const config::Config& cfg) {
    model::Gpt& gpt = trainer.model();
    model::init_random(gpt.weights(), 7, 0.02f);
    if (!gpt.frozen()) return;
    gpt.adapters().load_whole(model::initial_lora(gpt.adapters().whole(), cfg.training.seed));
}

}  // namespace

TEST_CASE("lora: with B zero the first loss is the model's and the base never changes", "[lora]") {
    for (const char* precision : {"fp32", "bf16", "fp16"}) {
        INFO(precision);
        auto ops = kernels::make_cpu_ops(2);
        const config::Config whole_cfg = lora_config(0, "none", precision);
        train::Trainer whole(whole_cfg, *ops, test::solo_grid());
        initialise(whole, whole_cfg);
        const double base_loss = whole.step(0, kTokens).loss;

        const config::Config cfg = lora_config(4, "none", precision);
        train::Trainer adapted(cfg, *ops, test::solo_grid());
        initialise(adapted, cfg);
        const std::vector<float> base = adapted.model().weights().params_to_host();
        // 16-bit weights stay 16-bit.
        CHECK(adapted.model().weights().params().dtype() ==
              adapted.model().options().precision.params);
        std::vector<double> losses;
        for (int s = 0; s < 4; ++s) losses.push_back(adapted.step(s, kTokens).loss);
        CHECK(losses[0] == base_loss);        // B = 0: exactly the model
        CHECK(losses[3] < losses[0] - 0.05);  // the adapters learn the three repeated samples
        CHECK(adapted.model().weights().params_to_host() == base);  // bitwise
        CHECK(adapted.model().weights().grads().bytes() == 0);
    }
}

TEST_CASE("lora: memory is the weights and the adapters' training state only", "[lora]") {
    auto whole_ops = kernels::make_cpu_ops(2);
    const config::Config whole_cfg = lora_config(0);
    train::Trainer whole(whole_cfg, *whole_ops, test::solo_grid());
    initialise(whole, whole_cfg);
    whole.step(0, kTokens);

    auto ops = kernels::make_cpu_ops(2);
    const config::Config cfg = lora_config(4);
    train::Trainer adapted(cfg, *ops, test::solo_grid());
    initialise(adapted, cfg);
    adapted.step(0, kTokens);

    // Per layer, rank 4: qkv 4·(32 + 96), attn_proj 4·(32 + 32), fc 4·(32 + 128), fc_proj
    // 4·(128 + 32): 2048 adapter values, 4096 over the two layers.
    const model::Gpt& gpt = adapted.model();
    REQUIRE(gpt.adapters().layout().total() == 4096);
    const std::size_t adapters = gpt.adapters().params().bytes() / sizeof(float);
    const train::MemoryUse m = adapted.memory(), w = whole.memory();
    CHECK(m.parameters == w.parameters + gpt.adapters().params().bytes());
    CHECK(m.gradients == gpt.adapters().grads().bytes());  // no gradient of the base
    CHECK(m.optimizer == 12 * adapters);                   // master, m and v of the adapters
    // What the allocator saw at its peak: the whole model's gradients and optimizer state
    // are gone; in their place the adapters', their scratch (input, output, input gradient:
    // N·F each) and their activations (N·r per adapter and layer).
    const std::size_t N = 32, F = 128, r = 4, layers = 2;
    const std::size_t scratch = 3 * N * F * 4 + layers * 4 * N * r * 4;
    const std::size_t base_training = w.gradients + w.optimizer;
    CHECK(m.peak + base_training <= w.peak + 20 * adapters + scratch);
    CHECK(m.peak < w.peak);
}

TEST_CASE("lora: recompute trains the adapters bitwise as without it, with dropout", "[lora]") {
    std::vector<std::vector<float>> adapters;
    std::vector<std::vector<double>> losses;
    for (const char* recompute : {"none", "selective", "full"}) {
        auto ops = kernels::make_cpu_ops(2);
        const config::Config cfg = lora_config(4, recompute);
        train::Trainer trainer(cfg, *ops, test::solo_grid());
        initialise(trainer, cfg);
        losses.emplace_back();
        for (int s = 0; s < 3; ++s) losses.back().push_back(trainer.step(s, kTokens).loss);
        adapters.push_back(trainer.model().adapters().params_to_host());
    }
    for (std::size_t i = 1; i < adapters.size(); ++i) {
        CHECK(losses[i] == losses[0]);
        CHECK(adapters[i] == adapters[0]);
    }
    CHECK(adapters[0] !=
          model::initial_lora(model::ParamLayout::for_lora(config::gpt_shape(lora_config(4)),
                                                           config::lora_of(lora_config(4)).shape),
                              lora_config(4).training.seed));
}

TEST_CASE("lora: model FLOPs leave out the frozen weights' gradients", "[lora]") {
    const config::Config whole = lora_config(0), adapted = lora_config(4);
    // B = 4, s = 16, l = 2, h = 32, V = 100, F = 128: the weights' GEMMs of one forward,
    // which the frozen model's missing weight gradients save, and the adapters' work (three
    // times their forward, 2·B·s·r per layer and unit of in + out: 4h + 2h + 2·(h + F)).
    const double B = 4, s = 16, l = 2, h = 32, V = 100, F = 128, r = 4;
    const double weights = 24 * B * s * l * h * h + 2 * B * s * h * V;
    const double adapters = 3 * 2 * B * s * l * r * (4 * h + 2 * h + 2 * (h + F));
    CHECK(whole.derived.flops_per_step ==
          Approx(72 * B * s * l * h * h * (1 + s / (12 * h) + V / (12 * l * h))));
    CHECK(adapted.derived.flops_per_step ==
          Approx(whole.derived.flops_per_step - weights + adapters));
}

TEST_CASE("lora: adapters files round-trip and bad ones are named", "[lora]") {
    const TempDir tmp("lora_files");
    const model::GptShape shape = config::gpt_shape(lora_config(4));
    model::LoraShape lora;
    lora.rank = 2;
    lora.targets = {true, false, false, true};  // qkv and fc_proj
    const model::ParamLayout whole = model::ParamLayout::for_lora(shape, lora);
    std::vector<float> values(whole.total());
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = 0.001f * static_cast<float>(i);
    model::save_lora_file(tmp / "a.safetensors", whole, values.data(), 4.0);

    const model::LoraFileInfo info = model::read_lora_info(tmp / "a.safetensors");
    CHECK(info.lora.rank == 2);
    CHECK(info.lora.targets == lora.targets);
    CHECK(info.alpha == 4.0);
    std::vector<float> back(whole.total(), -1.0f);
    model::load_lora_file(tmp / "a.safetensors", whole, back.data());
    CHECK(back == values);

    // Other targets or another rank than the file's.
    model::LoraShape more = lora;
    more.targets[1] = true;
    CHECK(error_of([&] {
              model::load_lora_file(tmp / "a.safetensors",
                                    model::ParamLayout::for_lora(shape, more), back.data());
          }) == tmp / "a.safetensors" +
                    ": no adapter \"base_model.model.transformer.h.0.attn.c_proj.lora_A.weight\" "
                    "(training.lora.targets and rank must match the file's)");
    model::LoraShape fewer = lora;
    fewer.targets[3] = false;
    CHECK(error_of([&] {
              model::load_lora_file(tmp / "a.safetensors",
                                    model::ParamLayout::for_lora(shape, fewer), back.data());
          }).find("is not an adapter training.lora asks for") != std::string::npos);
    model::LoraShape wider = lora;
    wider.rank = 3;
    CHECK(error_of([&] {
              model::load_lora_file(tmp / "a.safetensors",
                                    model::ParamLayout::for_lora(shape, wider), back.data());
          }) == tmp / "a.safetensors" +
                    ": adapter \"base_model.model.transformer.h.0.attn.c_attn.lora_A.weight\" is "
                    "[2, 32], the model's is [3, 32] (training.lora.rank must match the file's)");
    // A file without the metadata (a model's weights, say).
    const float one = 1.0f;
    io::write_safetensors(tmp / "w.safetensors",
                          std::vector<io::TensorToWrite>{{"wpe.weight", {1}, &one}});
    CHECK(error_of([&] { model::read_lora_info(tmp / "w.safetensors"); }) ==
          tmp / "w.safetensors" +
              ": no \"lora_rank\" in the metadata (not an adapters file trident wrote)");
}

// A llama (4 heads, 2 key/value heads: KV = 16, F = 48) with adapters of rank 4 on `targets`.
config::Config llama_lora_config(const std::string& targets) {
    return config::parse(
        "model: {arch: llama, vocab_size: 100, seq_len: 16, layers: 2, hidden: 32, heads: 4, "
        "kv_heads: 2, ffn_hidden: 48, init_from: unused.safetensors}\n"
        "training: {micro_batch: 2, global_batch: 4, lora: {rank: " +
            std::string(targets.empty() ? "0" : "4") +
            (targets.empty() ? "" : ", targets: " + targets) + "}}\n" +
            "data: {train: unused.bin}\n",
        "llama.yaml");
}

TEST_CASE("lora: llama's adapters follow their linears' splits, names and FLOPs", "[lora]") {
    const config::Config cfg = llama_lora_config("[q, k, v, o, gate, up, down]");
    const model::GptShape shape = config::gpt_shape(cfg);
    const model::LoraShape lora = config::lora_of(cfg).shape;
    // Tensor rank 1 of 2: A whole and B by rows beside q, k, v, gate and up (k's and v's by
    // key/value head), A by columns and B whole beside o and down.
    const model::ParamLayout half = model::ParamLayout::for_lora(shape, lora, 1, 2);
    const auto shape_of = [&](const std::string& name) {
        const model::ParamTensor* t = half.find(name);
        REQUIRE(t);
        return std::make_pair(t->shape, t->full_shape);
    };
    using Dims = std::vector<int64_t>;
    const std::string p = "layers.1.";
    CHECK(shape_of(p + "self_attn.q_proj.lora_A.weight") ==
          std::make_pair(Dims{4, 32}, Dims{4, 32}));
    CHECK(shape_of(p + "self_attn.q_proj.lora_B.weight") ==
          std::make_pair(Dims{16, 4}, Dims{32, 4}));
    CHECK(shape_of(p + "self_attn.k_proj.lora_B.weight") ==
          std::make_pair(Dims{8, 4}, Dims{16, 4}));
    CHECK(shape_of(p + "self_attn.v_proj.lora_B.weight") ==
          std::make_pair(Dims{8, 4}, Dims{16, 4}));
    CHECK(shape_of(p + "self_attn.o_proj.lora_A.weight") ==
          std::make_pair(Dims{4, 16}, Dims{4, 32}));
    CHECK(shape_of(p + "self_attn.o_proj.lora_B.weight") ==
          std::make_pair(Dims{32, 4}, Dims{32, 4}));
    CHECK(shape_of(p + "mlp.up_proj.lora_B.weight") == std::make_pair(Dims{24, 4}, Dims{48, 4}));
    CHECK(shape_of(p + "mlp.down_proj.lora_A.weight") == std::make_pair(Dims{4, 24}, Dims{4, 48}));
    // Rank 1's rows of k's B are key/value head 1's: whole rows 8 .. 15.
    std::vector<std::size_t> starts;
    model::for_each_slice_run(*half.find(p + "self_attn.k_proj.lora_B.weight"), 1,
                              [&](std::size_t, std::size_t whole, std::size_t count) {
                                  starts.push_back(whole);
                                  CHECK(count == 8 * 4);
                              });
    CHECK(starts == std::vector<std::size_t>{8 * 4});
    // Per layer 4·(2·(32 + 32) + 2·(32 + 16) + 3·(32 + 48)) = 1856 values.
    CHECK(model::ParamLayout::for_lora(shape, lora).total() == 2 * 1856);

    // PEFT's Llama names in an adapters file.
    const TempDir tmp("llama_lora_files");
    const model::ParamLayout whole = model::ParamLayout::for_lora(shape, lora);
    std::vector<float> values(whole.total(), 0.5f);
    model::save_lora_file(tmp / "a.safetensors", whole, values.data(), 8.0);
    const io::SafetensorsFile file = io::SafetensorsFile::open(tmp / "a.safetensors");
    CHECK(file.tensors().size() == 2 * 7 * 2);
    CHECK(file.find("base_model.model.model.layers.1.mlp.gate_proj.lora_B.weight"));
    CHECK(model::read_lora_info(tmp / "a.safetensors").lora.targets == lora.targets);

    // Model FLOPs: the frozen weights' GEMMs of one forward saved, the adapters' added (three
    // times 2·B·s·r per layer and unit of in + out: q, o 2h; k, v h + KV; gate, up, down h + F).
    const double B = 4, s = 16, l = 2, h = 32, V = 100, F = 48, KV = 16, r = 4;
    const double weights = 2 * B * s * (l * (2 * h * h + 2 * h * KV + 3 * h * F) + V * h);
    const double adapters = 3 * 2 * B * s * l * r * (2 * 2 * h + 2 * (h + KV) + 3 * (h + F));
    CHECK(cfg.derived.flops_per_step ==
          Approx(llama_lora_config("").derived.flops_per_step - weights + adapters));
}

TEST_CASE("lora: the manifest records the adapters and the base weights", "[lora]") {
    const TempDir tmp("lora_manifest");
    train::Manifest m;
    m.step = 3;
    m.precision = "fp32";
    m.shape = config::gpt_shape(lora_config(4));
    m.layout.chunk_layers = {2};
    m.lora = {8, {"qkv", "fc"}, 16.0, "/data/base.safetensors", std::string(64, 'a')};
    {
        std::ofstream out(tmp / "manifest.json");
        out << train::manifest_json(m);
    }
    const train::Manifest back = train::read_manifest(tmp.dir.string());
    CHECK(back.lora.rank == 8);
    CHECK(back.lora.targets == std::vector<std::string>{"qkv", "fc"});
    CHECK(back.lora.alpha == 16.0);
    CHECK(back.lora.base == "/data/base.safetensors");
    CHECK(back.lora.base_sha256 == std::string(64, 'a'));
    // Without adapters the manifest says nothing of them.
    m.lora = {};
    CHECK(train::manifest_json(m).find("lora") == std::string::npos);
}

TEST_CASE("lora: adapter gradients through their dropout match finite differences", "[lora]") {
    auto ops = kernels::make_cpu_ops(2);
    const config::Config cfg = lora_config(4, "none", "fp32", 0.5);  // no other dropout
    train::Trainer trainer(cfg, *ops, test::solo_grid());
    initialise(trainer, cfg);
    model::Gpt& gpt = trainer.model();
    // B of the size of A, so that the adapters' share of the input gradients is not small.
    std::vector<float> values = gpt.adapters().params_to_host();
    for (const model::ParamTensor& t : gpt.adapters().layout().tensors())
        if (t.name.find("lora_B") != std::string::npos)
            for (std::size_t i = 0; i < t.numel; ++i)
                values[t.offset + i] = 0.3f * (kernels::uniform_open(11, t.offset + i) - 0.5f);
    gpt.adapters().load(values);
    const double loss = trainer.accumulate_gradients(1, kTokens);
    const std::vector<float> grads = gpt.adapters().grads_to_host();
    // Layer 0's gradients come back through layer 1's adapters' input gradients (masked).
    for (const char* name : {"h.0.attn.c_attn.lora_A.weight", "h.0.attn.c_attn.lora_B.weight",
                             "h.0.mlp.c_proj.lora_A.weight", "h.1.mlp.c_fc.lora_A.weight"}) {
        INFO(name);
        const model::ParamTensor* t = gpt.adapters().layout().find(name);
        REQUIRE(t);
        std::size_t at = t->offset;  // the element of largest gradient
        for (std::size_t i = t->offset; i < t->offset + t->numel; ++i)
            if (std::abs(grads[i]) > std::abs(grads[at])) at = i;
        const float original = values[at], eps = 1e-2f;
        double sides[2];
        for (int side = 0; side < 2; ++side) {
            values[at] = original + (side == 0 ? eps : -eps);
            gpt.adapters().load(values);
            sides[side] = trainer.accumulate_gradients(1, kTokens);  // the same masks
        }
        values[at] = original;
        gpt.adapters().load(values);
        const double difference = (sides[0] - sides[1]) / (2.0 * eps);
        CHECK(std::abs(grads[at]) > 1e-3);
        CHECK(difference == Approx(grads[at]).epsilon(0.01));
    }
    CHECK(trainer.accumulate_gradients(1, kTokens) == loss);
}
