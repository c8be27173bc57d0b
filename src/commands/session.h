// What `train` and `bench` both set up before the first step: the backend, the start-up
// summary, the model's initial weights and the measured peak.
#pragma once

#include <functional>
#include <memory>

#include "config/config.h"
#include "error.h"
#include "data/tokenizer.h"
#include "kernels/ops.h"
#include "parallel/world.h"
#include "train/generator.h"
#include "train/trainer.h"

namespace trident::commands {

// An error every rank raises alike at the same point of `run` (after agreeing on it), so it
// is reported once, by rank 0, without aborting the job.
class EveryRankError : public Error {
public:
    using Error::Error;
};

// Runs a command on every rank of `world` without leaving any rank waiting: `set_up` (reading
// the config and data, building the grid: nothing that communicates beyond the grid's own
// set-up) runs everywhere and the ranks agree whether all succeeded, rank 0 reporting the
// problem; then `run`, where an error on any rank aborts the job. Returns the exit code.
int run_on_every_rank(parallel::World& world, const std::function<void()>& set_up,
                      const std::function<void()>& run);

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
