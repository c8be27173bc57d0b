// trident_model_dump: the loss and every parameter gradient of one global batch, for the
// PyTorch reference test (tests/python/test_gpt2_reference.py).
//
// Loads the model from model.init_from, takes step 0's global batch from data.train, runs
// forward and backward over all its microbatches, and writes the gradients in Hugging Face
// GPT-2 (or Llama) layout and names, plus a tensor "loss" of shape [1] (the mean loss), as
// safetensors. Under mpirun with parallel.tensor = M, the gradients are gathered from the M slices
// (and summed over the C context ranks): the layout tests compare them with those of one process.
// Under low-rank adapters (training.lora) the gradients are the adapters' (the model is
// frozen), under their names (model/param_layout.h); so are those of a model whose MLP no
// Hugging Face class of its family has (model.mlp).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <exception>

#include "commands/session.h"
#include "config/config.h"
#include "data/dataset.h"
#include "io/safetensors.h"
#include "kernels/error.h"
#include "kernels/ops.h"
#include "model/gpt.h"
#include "model/hf_gpt2.h"
#include "model/hf_llama.h"
#include "parallel/grid.h"
#include "parallel/world.h"
#include "train/trainer.h"

using namespace trident;

// Tensors every tensor-parallel rank holds whole (LayerNorms, row-parallel biases, wpe) must
// have bitwise the same gradient on every rank, or the replicas would drift apart.
static void check_replicated_gradients(model::Gpt& gpt, parallel::Comm& tensor) {
    const std::vector<float> local = gpt.weights().grads_to_host();
    std::vector<float> all(local.size() * static_cast<std::size_t>(tensor.size()));
    tensor.all_gather(local.data(), all.data(), local.size());
    for (const model::ParamTensor& t : gpt.layout().tensors()) {
        if (t.split.kind != model::SplitKind::replicated) continue;
        for (int r = 1; r < tensor.size(); ++r)
            if (!std::equal(all.begin() + t.offset, all.begin() + t.offset + t.numel,
                            all.begin() + r * local.size() + t.offset))
                throw Error("the gradient of replicated " + t.name +
                            " differs between tensor ranks 0 and " + std::to_string(r));
    }
}

// Every rank computes its slice of the gradients; rank 0 gathers and writes them.
static void dump(const config::Config& cfg, parallel::Grid& grid, const std::string& output) {
    if (!cfg.model.init_from) throw Error("model.init_from must name the weights to load");
    if (cfg.parallel.data != 1)
        throw Error("the gradient dump is of one replica's batch: run it with parallel.data = 1");
    auto ops = kernels::make_cpu_ops(cfg.training.threads);
    train::Trainer trainer(cfg, *ops, grid);
    commands::initialise_weights(cfg, trainer.model());
    data::Dataset train_data = data::open_train_data(cfg);
    const double loss = trainer.accumulate_gradients(
        0, [&](uint64_t k, std::span<int32_t> in, std::span<int32_t> tgt) {
            train_data.fill(k, in, tgt);
        });

    // Each context rank holds its tokens' part of the gradients: training sums them over the
    // data-context group, here (one replica) over the context group.
    model::Gpt& gpt = trainer.model();
    model::FlatBuffer& local = gpt.trainable().grads();
    grid.context().all_reduce(local.at(0), local.size());
    if (!gpt.frozen()) check_replicated_gradients(gpt, grid.tensor());
    const std::vector<float> grads =
        gpt.frozen() ? trainer.full_lora_grads() : trainer.full_grads();  // collective
    if (grid.rank() != 0) return;
    model::HfTensors out;
    const model::GptShape& shape = gpt.layout().shape();
    // Our names where Hugging Face's family has no such model (another model.mlp).
    const bool ours = gpt.frozen() || shape.mlp != model::default_mlp(shape.arch);
    const model::ParamLayout& whole = gpt.trainable().whole();
    if (ours)
        for (const model::ParamTensor& t : whole.tensors())
            out.tensors.push_back({t.name, t.full_shape, grads.data() + t.offset});
    else if (shape.arch == model::Arch::llama)
        out.tensors = model::to_hf_llama_tensors(gpt.weights().whole(), grads.data());
    else
        out = model::to_hf_tensors(gpt.weights().whole(), grads.data());
    const float loss_f = static_cast<float>(loss);
    out.tensors.push_back({"loss", {1}, &loss_f});
    io::write_safetensors(output, out.tensors);
    std::printf("loss %.9g\n", loss);
}

int main(int argc, char** argv) {
    CLI::App app{"Loss and gradients of one global batch, for the PyTorch reference test"};
    std::string config_path, output;
    std::vector<std::string> overrides;
    app.add_option("--config", config_path, "YAML config")->required();
    app.add_option("--set", overrides, "Config overrides")->take_all();
    app.add_option("--output", output, "Output .safetensors")->required();
    CLI11_PARSE(app, argc, argv);
    parallel::World world(argc, argv);
    try {
        const config::Config cfg = config::load(config_path, overrides);
        parallel::Grid grid(world, commands::grid_shape(cfg));
        dump(cfg, grid, output);
    } catch (const std::exception& e) {
        return parallel::report_failure(world, e.what(), parallel::FailureKind::this_rank);
    }
    return 0;
}
