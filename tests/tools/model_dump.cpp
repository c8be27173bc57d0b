// trident_model_dump: the loss and every parameter gradient of one global batch, for the
// PyTorch reference test (tests/python/test_gpt2_reference.py).
//
// Loads the model from model.init_from, takes step 0's global batch from data.train, runs
// forward and backward over all its microbatches, and writes the gradients in Hugging Face
// GPT-2 layout and names, plus a tensor "loss" of shape [1] (the mean loss), as safetensors.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

#include "config/config.h"
#include "data/dataset.h"
#include "error.h"
#include "io/safetensors.h"
#include "kernels/ops.h"
#include "model/gpt.h"
#include "model/hf_gpt2.h"
#include "train/model_shape.h"

using namespace trident;

static int dump(const std::string& config_path, const std::vector<std::string>& overrides,
                const std::string& output) {
    const config::Config cfg = config::load(config_path, overrides);
    if (!cfg.model.init_from) throw Error("model.init_from must name the weights to load");
    auto ops = kernels::make_cpu_ops(cfg.training.threads);
    model::Gpt gpt(*ops, train::gpt_shape(cfg), cfg.training.micro_batch, 0.0f);
    std::vector<float> host(gpt.layout().total(), 0.0f);
    model::load_hf_gpt2(*cfg.model.init_from, gpt.layout(), host.data());
    gpt.load_params(host);

    data::Dataset train_data = data::open_train_data(cfg);
    const std::size_t T = static_cast<std::size_t>(cfg.model.seq_len);
    const int mb = cfg.training.micro_batch;
    std::vector<int32_t> inputs(mb * T), targets(mb * T);
    gpt.zero_grads();
    double loss = 0;
    for (int j = 0; j < cfg.derived.grad_accum_steps; ++j) {
        for (int i = 0; i < mb; ++i)
            train_data.fill(static_cast<uint64_t>(j * mb + i),
                            std::span(inputs).subspan(i * T, T),
                            std::span(targets).subspan(i * T, T));
        loss += gpt.forward(inputs.data(), targets.data(), false, 0);
        gpt.backward(1.0f / static_cast<float>(cfg.derived.tokens_per_step));
    }
    loss /= cfg.derived.grad_accum_steps;

    const auto grads = gpt.grads_to_host();
    model::HfTensors out = model::to_hf_tensors(gpt.layout(), grads.data());
    const float loss_f = static_cast<float>(loss);
    out.tensors.push_back({"loss", {1}, &loss_f});
    io::write_safetensors(output, out.tensors);
    std::printf("loss %.9g\n", loss);
    return 0;
}

int main(int argc, char** argv) {
    CLI::App app{"Loss and gradients of one global batch, for the PyTorch reference test"};
    std::string config_path, output;
    std::vector<std::string> overrides;
    app.add_option("--config", config_path, "YAML config")->required();
    app.add_option("--set", overrides, "Config overrides")->take_all();
    app.add_option("--output", output, "Output .safetensors")->required();
    CLI11_PARSE(app, argc, argv);
    try {
        return dump(config_path, overrides, output);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "trident_model_dump: error: %s\n", e.what());
        return 1;
    }
}
