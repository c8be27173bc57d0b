// Per-step metrics: one line on stdout every logging.interval steps, one JSON object per step
// in the JSON-lines file of logging.metrics, and one TensorBoard summary per step in
// logging.tensorboard's event file (docs/ARCHITECTURE.md, "Metrics").
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "io/output_file.h"
#include "io/tensorboard.h"
#include "parallel/comm.h"
#include "train/moe_balance.h"

namespace trident::train {

struct StepMetrics {
    int step = 0;  // 1-based: the number of updates done after this step
    int steps = 0;
    double loss = 0, lr = 0, grad_norm = 0;
    double tokens_per_s = 0, tflops = 0, mfu = 0, step_ms = 0;
    double loss_scale = 1;    // fp16's dynamic loss scale in this step (1 otherwise)
    bool skipped = false;     // no update: non-finite gradients, or a spike
    std::string skip_reason;  // why (train/step_guard.h), when skipped
    int skipped_total = 0;    // steps skipped so far
    double eta_s = 0;         // the time left (StepTimes)
    std::optional<double> val_loss;
    // A mixture of experts' Σ_l aux_l and Σ_l z_l (StepResult), where the model has one.
    std::optional<double> moe_aux_loss, moe_z_loss;
    // Each MoE layer's load over the global batch (train/moe_balance.h).
    std::vector<MoeLayerLoad> moe_loads;
    // The first step of a resumed run: the checkpoint's step it went on from.
    std::optional<int> resumed_at;
    parallel::CommStats tensor_comm;      // the tensor-parallel group's traffic in the step
    int64_t activation_sets = 0;          // peak (microbatch, chunk) activations held
    double documents_per_window = 0;      // data.documents: mask (0: not recorded)
    parallel::CommStats data_comm;        // the data-context group's traffic in the step
    parallel::CommStats context_comm;     // the context-parallel group's traffic in the step
    parallel::CommStats kv_replica_comm;  // the key/value head replicas' (M > KVH)
    parallel::CommStats expert_comm;      // the expert group's (parallel.expert > 1)
    parallel::CommStats pipeline_comm;    // the pipeline group's traffic in the step
    parallel::CommStats embedding_comm;   // the embedding group's (a tied wte's two stages)
    // Bytes held by this rank: parameters, gradients, optimizer state, activations, peak.
    int64_t mem_params = 0, mem_grads = 0, mem_optimizer = 0, mem_activations = 0, mem_peak = 0;
    // The same five figures of the first rank of every pipeline stage, in stage order (the
    // last stage holds the LM head and the logits: its figures differ from rank 0's).
    std::vector<std::array<int64_t, 5>> mem_stages;
    // Bytes of optimizer state this rank read from and wrote to its offload file in the step
    // (optimizer.offload: nvme); -1, not written, otherwise.
    int64_t offload_read = -1, offload_written = -1;
    // The same of ZeRO-3's parameter shard (optimizer.offload_params); -1, not written, without.
    int64_t offload_param_read = -1, offload_param_written = -1;
};

class MetricsLog {
public:
    // path: the JSON-lines file (its directory is created), or none. A fresh run starts it
    // afresh (saying so in note() when it held anything); a run resumed at step `resumed_at` adds
    // to it, which it must end at that step (its steps after it, left by a run that went on past
    // its last checkpoint, are cut off and run again): a file that ends elsewhere holds another
    // run's steps and is refused. A missing or empty file is started. `tensorboard`: the directory
    // of the event file, or none. Throws trident::Error naming the key and the file.
    MetricsLog(const std::optional<std::string>& path, int interval,
               std::optional<int> resumed_at = std::nullopt,
               const std::optional<std::string>& tensorboard = std::nullopt);

    // What opening did beyond the expected ("cut back to step 30 ..."), or "".
    const std::string& note() const { return note_; }

    // Prints the step's line (every logging.interval steps), appends its JSON object and its
    // TensorBoard summary. A write that fails throws trident::Error naming the key, the file
    // and the errno, having cut the file back to its last whole record, so that a reader
    // never meets half a record and a later record can still follow.
    void record(const StepMetrics& m);
    // The validation before the first step: {"step": 0, "val_loss": ...} in the JSON-lines
    // file, nothing printed.
    void record_validation(int step, double val_loss);

private:
    void print(const StepMetrics& m);
    void write_json(const StepMetrics& m);

    std::unique_ptr<io::OutputFile> file_;
    std::unique_ptr<io::EventWriter> events_;
    int interval_;
    std::string note_;
    bool warned_mfu_ = false;  // the note on an MFU above 100% is printed once
};

// The time a run has left, from its recent steps: the steps left times the median of the last
// kWindow step times. A stall (a slow disk, a busy machine) moves the estimate only while it is
// among them, and a single one not at all; a mean over the whole run would carry it to the end.
class StepTimes {
public:
    static constexpr std::size_t kWindow = 20;
    void add(double seconds);
    double seconds_left(int steps_left) const;

private:
    std::deque<double> recent_;  // the last kWindow step times, oldest first
};

// The scalars of a step as TensorBoard shows them (tag, value): those Megatron-LM logs.
std::vector<std::pair<std::string, double>> tensorboard_scalars(const StepMetrics& m);

// "12.3 M" style counts, and sizes of memory and files in binary units as device memory is
// quoted ("12.34 GiB", "5.6 MiB"), for the start-up summary, `plan` and `checkpoint info`.
std::string human_count(double n);
std::string human_bytes(double bytes);
// "1 replica", "2 replicas", "3 microbatches": a count and its noun, in the plural unless one.
std::string counted(int64_t n, const std::string& noun);
// "45s", "3m07s", "2h05m" for the ETA.
std::string human_duration(double seconds);

}  // namespace trident::train
