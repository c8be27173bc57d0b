// What `train` and `bench` both set up before the first step: the backend, the start-up
// summary, the model's initial weights and the measured peak.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "config/config.h"
#include "data/tokenizer.h"
#include "kernels/error.h"
#include "kernels/ops.h"
#include "parallel/grid.h"
#include "parallel/watchdog.h"
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
// problem; then `run`, where an error on any rank aborts the job (an allocation that failed
// as "out of memory", with where the rank was). Returns the exit code.
int run_on_every_rank(parallel::World& world, const std::function<void()>& set_up,
                      const std::function<void()>& run);

// The grid the config asks for: P × M × C × D, and the tensor ranks sharing each key/value
// head (model/param_layout.h).
parallel::GridShape grid_shape(const config::Config& cfg);

// The stall watchdog of this rank (parallel/watchdog.h) as training.collective_timeout*
// set it, watching the calling thread; none in a world of one, where no call can wait.
std::unique_ptr<parallel::Watchdog> start_watchdog(const config::Config& cfg,
                                                   const parallel::Grid& grid);

// Refuses, with one line, a CPU run whose model states alone cannot fit this machine's
// memory: each rank's weights, gradients and optimizer state (plan/memory_model.h's
// model_states of its 1/(P·M) of the parameters, sharded as its ZeRO stage says; under
// low-rank adapters the frozen weights alone), times the `ranks_on_node` ranks sharing the
// machine, against its physical memory. A lower bound of what the run needs (activations
// come on top), computed from the config in 64-bit arithmetic before anything is built, so a
// model of absurd size stops here instead of in the kernel's out-of-memory killer.
void check_fits_memory(const config::Config& cfg, int ranks_on_node);

// The device a run computes on, as every rank agreed.
struct Device {
    bool gpu = false;         // else the CPU
    bool shared_gpu = false;  // ranks share GPUs: collectives through MPI with host staging
    std::string name;         // "cpu", or the GPU as CUDA describes it
};

// The device the config asks for, chosen alike on every rank (collective over the world, a
// set-up step): device "auto" takes a GPU per rank when every rank sees one, else the CPU,
// and says which (when `announce`: one rank speaks for all); "cuda" binds each rank to its
// GPU and fails, with the same message on every rank, naming the ranks that see none.
Device choose_device(const config::Config& cfg, parallel::World& world, bool announce);

// The backend of `device`. For a GPU, the grid's communicators are wrapped to carry device
// buffers: NCCL, or MPI through host memory where ranks share a GPU (said when `announce`).
// Collective over the world.
std::unique_ptr<kernels::Ops> make_backend(const config::Config& cfg, const Device& device,
                                           parallel::Grid& grid, bool announce);

// The peak FLOP/s MFU is against, and where it comes from.
struct Peak {
    double flops = 0;
    std::string source;
};
// hardware.peak_flops when set, else a GPU's dense bf16 datasheet rate when it is listed,
// else the backend's fp32 GEMM rate measured now (train/device_peak.h), the most any rank of
// `world` measured. Collective over `world` when measured.
Peak peak_flops(const config::Config& cfg, const Device& device, kernels::Ops& ops,
                parallel::Comm& world);

// "trident: KIND: TEXT" on stderr, flushed: a warning, or a note (what was settled without
// fault).
void warn(const std::string& text, const char* kind = "warning");

// What loading the config accepted with a warning (a deprecated key) or settled with a note
// (an override taking a deprecated key's place), on stderr.
void print_warnings(const config::Config& cfg);

// Prints where a training run's output goes: checkpoints, metrics, trace.
void print_outputs(const config::Config& cfg);

// Prints the model, layout and batch figures of the run.
void print_summary(const config::Config& cfg, const kernels::Ops& ops, const Peak& peak);

// model.init_from if set (a Hugging Face file or a checkpoint, train/base_weights.h), else
// GPT-2 initialisation from training.seed; and under low-rank adapters, the adapters from
// training.lora.init_from, else as model/lora.h's initial_lora draws them from the seed.
// Returns what model.init_from read ("" without it).
std::string initialise_weights(const config::Config& cfg, model::Gpt& model);

// The prompt and its continuation as text, handed to `emit` piece by piece: the prompt, then
// each token's text as soon as it is generated (a token's bytes, which concatenated are the
// whole text's). An empty prompt starts a new document (the end-of-text token, or a newline
// for the byte tokenizer).
void generate_text(model::Decoder& model, const data::Tokenizer& tokenizer,
                   const std::string& prompt, const train::SamplingOptions& opts,
                   const std::function<void(const std::string&)>& emit);

}  // namespace trident::commands
