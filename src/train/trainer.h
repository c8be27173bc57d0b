// One training step and one validation pass over the model, independent of where the tokens
// come from (the `train` command feeds it the dataset, the `bench` command random tokens)
// and of the grid: a rank runs its pipeline stage's schedule on its tensor-parallel slice.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "config/config.h"
#include "data_parallel/data_parallel.h"
#include "kernels/ops.h"
#include "model/gpt.h"
#include "optim/clipping.h"
#include "optim/loss_scaler.h"
#include "optim/update.h"
#include "parallel/grid.h"
#include "pipeline/executor.h"
#include "train/first_sighting.h"
#include "train/moe_balance.h"
#include "train/step_guard.h"

namespace trident::train {

// Fills the inputs and targets (T tokens each) of global sample k.
using SampleFn =
    std::function<void(uint64_t sample, std::span<int32_t> inputs, std::span<int32_t> targets)>;

// Bytes this rank holds, as the allocator counts them.
struct MemoryUse {
    // The stage's flat buffers (padded), and a 4-bit base's store and tile.
    std::size_t parameters = 0, gradients = 0;
    std::size_t optimizer = 0;    // fp32 master weights and the optimizer's state (AdamW: 12
                                  // bytes / param / D)
    std::size_t activations = 0;  // the activation sets of the microbatches in flight, at most
    std::size_t peak = 0;         // everything allocated, at most
    // A 4-bit base (model/nf4_base.h): its codes and constants, the parameters they stand
    // for, and its dequantization tile (all in `parameters` too).
    std::size_t quantized = 0, quantized_parameters = 0, tile = 0;
};

struct StepResult {
    double loss = 0;       // mean over every token of the global batch, before the update
    double grad_norm = 0;  // before clipping, unscaled
    // A mixture of experts' Σ over its layers of the balancing loss and of the z-loss, each the
    // mean over the microbatches and replicas (without their coefficients).
    double moe_aux_loss = 0, moe_z_loss = 0;
    // Each MoE layer's load over the global batch (train/moe_balance.h), in layer order.
    std::vector<MoeLayerLoad> moe_loads;
    double loss_scale = 1;    // the loss was multiplied by this before backward (fp16)
    bool skipped = false;     // not applied: non-finite, or a spike (train/step_guard.h)
    std::string skip_reason;  // why, when skipped (Verdict::reason)
    std::string skip_note;    // what to say of it (empty for fp16's overflows)
    double lr = 0;
    double seconds = 0;               // wall time of the whole step
    parallel::CommStats tensor_comm;  // what the tensor-parallel group moved in the step
    std::size_t activation_sets = 0;  // most microbatches' activations held at once so far
    // The documents in a window of the global batch, on average, under data.documents: mask
    // (0 otherwise): train/token_loss.h.
    double documents_per_window = 0;
    // No position of the global batch counts a loss (train/token_loss.h): no loss, no gradient.
    bool nothing_counted = false;
    // What the data-context group (the D·C ranks holding the same weights) moved in the step.
    parallel::CommStats data_comm;
    parallel::CommStats context_comm;  // what the context-parallel group moved in the step
    // What the ranks sharing a key/value head (M > KVH) moved in the step: its gradient's sum.
    parallel::CommStats kv_replica_comm;
    parallel::CommStats expert_comm;     // the expert group's: its MoE layers' all-to-alls
    parallel::CommStats pipeline_comm;   // what the pipeline group moved in the step
    parallel::CommStats embedding_comm;  // the tied embedding's first and last stage: its sum
    MemoryUse memory;
    // Bytes of optimizer state read from and written to the offload file in the update
    // (optimizer.offload: nvme; 12 bytes per owned parameter each); -1 without one.
    int64_t offload_read = -1, offload_written = -1;
    // Bytes of ZeRO-3's parameter shard read from and written to its file in the step
    // (optimizer.offload_params: docs/FORMULAS.md gives how many); -1 without one.
    int64_t offload_param_read = -1, offload_param_written = -1;
};

class Trainer {
public:
    // `grid`: this rank's place in the grid (parallel::Grid() for one process).
    Trainer(const config::Config& cfg, kernels::Ops& ops, parallel::Grid& grid);

    model::Gpt& model() { return model_; }
    kernels::Ops& ops() { return ops_; }
    optim::Updater& optimizer() { return optimizer_; }
    data_parallel::DataParallel& data_parallel() { return data_parallel_; }
    // The optimizer's state from a checkpoint, and the parameters its master weights give,
    // made whole on every replica; collective over the data group.
    void restore_optimizer(const optim::OptimizerState& state);
    // This rank's optimizer state (optim::Updater::state()). Collective where the state is in
    // files: a failed read on any rank stops every rank with it (TrainingStopped).
    optim::OptimizerState optimizer_state();

    optim::LossScaler& scaler() { return scaler_; }
    StepGuard& guard() { return guard_; }

    // Step `step` (0-based): forward and backward over every microbatch of the global batch
    // (samples step*B ... step*B + B - 1) in the configured pipeline schedule, clipping,
    // the optimizer's update; or, where the gradients are not finite, no update (fp16: the loss
    // scale halves; bf16/fp32: as training.nonfinite says), nor where the step is a spike
    // (training.skip_spikes). Every rank returns the same figures. Throws TrainingStopped
    // (train/step_guard.h) on every rank alike where training is to stop.
    StepResult step(int step, const SampleFn& sample);
    // The first half of a step: the gradients of its global batch times loss_scale, in
    // model().grads(). Returns the mean loss over every (counted) token of the batch.
    double accumulate_gradients(int step, const SampleFn& sample, double loss_scale = 1.0);
    // The step's mixture-of-experts losses (model.moe; their sums over the microbatches and
    // replicas, averaged) and loads into r; nothing for a dense model.
    void moe_losses(StepResult& r);
    // Mean loss over every (counted) token of samples 0 .. sequences - 1 (a multiple of micro_batch
    // × D), each replica evaluating its share: no dropout, no update. The same on every layout.
    double evaluate(const SampleFn& sample, int sequences);

    // The whole model's parameters or gradients (a buffer of ParamLayout(shape)), put
    // together from every stage's and tensor rank's part; collective, same on every rank.
    // Sharded gradients are those reduced into the shards (after a step's reduction). A
    // frozen model's parameters come with its adapters merged in (W + s·B·A).
    std::vector<float> full_params();
    std::vector<float> full_grads();
    // A frozen model's adapters' gradients, whole (a buffer of ParamLayout::for_lora);
    // collective.
    std::vector<float> full_lora_grads();
    // This rank's trainable parameters (the adapters of a frozen model) as their layout lays
    // them out, whole (ZeRO-3: put together from the data-parallel replicas' shards);
    // collective over the data group.
    std::vector<float> local_params();
    // This rank's own model parameters (frozen under adapters or not) as layout() lays them
    // out, whole; collective over the data group where they are sharded (ZeRO-3).
    std::vector<float> local_model_params();

    MemoryUse memory() const;

    // The Chrome trace of the steps run while it records (see io/chrome_trace.h).
    io::TraceRecorder& trace() { return trace_; }
    // Writes it (collective); tracks named by grid coordinates.
    void write_trace(const std::string& path);

private:
    // This rank's parameters or gradients (once the parameters' gather has finished) of `set`,
    // whole (summed over the data group when its buffer is sharded), and put together with
    // every other rank's.
    std::vector<float> local(const model::WeightSet& set, bool grads);
    std::vector<float> gather_full(const model::WeightSet& set, bool grads);
    // The loss of the stage with the LM head (the last; ZB-V's first), given to every stage.
    double from_last_stage(double loss);
    // `work` on the optimizer; with the state in files, a failed read or write on any rank
    // (an optim::OffloadError) stops every rank with it (TrainingStopped). Collective then.
    void agree_on_offload(const std::function<void()>& work);
    // The update, as agree_on_offload runs it.
    void step_optimizer(double lr, float factor);
    // ZeRO-3's parameter shard in its file (optimizer.offload_params), around a run of the
    // schedule: before, the shard moved from memory to the file if it is still in memory (as
    // initialised or loaded) and the file checked; after, any read of it that failed reported.
    // Each is agreed on by every rank. Nothing without the file.
    void before_gathers();
    void after_gathers();
    // `work` with the parameter shard in memory: read from its file (offload_params) and,
    // where it `changes`, written back after; let go again either way.
    void on_held_shard(bool changes, const std::function<void()>& work);
    // The loss over counted tokens (train/token_loss.h) from this stage's sum of microbatch
    // means and the global batch's counted positions: the same on every rank.
    double token_loss(double loss_sum, double counted);
    // The tokens of a microbatch of samples first, first + 1, ...: this context rank's
    // (model().local_tokens() of each sample, at the positions it holds) inputs and targets.
    void fill_microbatch(const SampleFn& sample, uint64_t first, std::span<int32_t> inputs,
                         std::span<int32_t> targets);

    const config::Config& cfg_;
    kernels::Ops& ops_;
    parallel::Grid& grid_;
    parallel::Comm& tensor_;
    parallel::Comm& pipeline_;
    parallel::Comm& embedding_;
    parallel::Comm& data_;
    parallel::Comm& context_;
    parallel::Comm& data_context_;
    model::Gpt model_;
    // ZeRO-3's parameter shard's file (optimizer.offload_params), or null.
    std::unique_ptr<data_parallel::ParamFile> param_file_;
    data_parallel::DataParallel data_parallel_;
    optim::Updater optimizer_;
    optim::GradNorm grad_norm_;
    optim::LossScaler scaler_;
    StepGuard guard_;
    FirstSighting sighting_;
    pipeline::Executor executor_;
    MoeBalance balance_;  // the router bias's update (model.moe.bias_update_rate)
    io::TraceRecorder trace_;
    double documents_per_window_ = 0;  // of the last step (StepResult)
    bool nothing_counted_ = false;     // of the last step (StepResult)
    // One whole sample (context parallelism; the counted positions of train/token_loss.h).
    std::vector<int32_t> whole_inputs_, whole_targets_;
};

}  // namespace trident::train
