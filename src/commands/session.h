// What `train` and `bench` both set up before the first step: the backend, the start-up
// summary, the model's initial weights and the measured peak.
#pragma once

#include <memory>

#include "config/config.h"
#include "data/tokenizer.h"
#include "kernels/ops.h"
#include "train/generator.h"
#include "train/trainer.h"

namespace trident::commands {

// The backend the config asks for; device "auto" falls back to the CPU and says so (when
// `announce`: one rank speaks for all).
std::unique_ptr<kernels::Ops> make_backend(const config::Config& cfg, bool announce);

// Prints the model, layout and batch figures of the run.
void print_summary(const config::Config& cfg, const kernels::Ops& ops, double peak_flops);

// model.init_from if set, else GPT-2 initialisation from training.seed.
void initialise_weights(const config::Config& cfg, model::Gpt& model);

// The prompt and its continuation as text. An empty prompt starts a new document (the
// end-of-text token, or a newline for the byte tokenizer).
std::string generate_text(model::Gpt& model, const data::Tokenizer& tokenizer,
                          const std::string& prompt, const train::SamplingOptions& opts);

}  // namespace trident::commands
