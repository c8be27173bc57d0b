// The training loop of `trident train` (train.cpp): the steps from the start to
// training.steps, with validation, metrics, health checks, checkpoints and preemption, on every
// rank of the grid (rank 0 speaks for all).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "commands/session.h"
#include "config/config.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "parallel/grid.h"
#include "parallel/world.h"
#include "train/async_checkpoint.h"
#include "train/checkpoint.h"
#include "train/directory_lock.h"
#include "train/metrics.h"
#include "train/stragglers.h"
#include "train/trainer.h"

namespace trident::commands {

// Everything a run needs that involves no communication beyond the grid's own set-up.
struct Setup {
    config::Config cfg;
    std::unique_ptr<parallel::Grid> grid;
    std::unique_ptr<data::Dataset> train_data, valid_data;
    Device device;
    // The data files as this node sees them, on one rank per node (the others: none), which is
    // enough to notice a change and reads a node's files once.
    std::vector<train::DataFileRecord> data_files;
    // Rank 0's hold on checkpoint.dir for the run's life (none without one, and elsewhere).
    std::unique_ptr<train::DirectoryLock> dir_lock;
    // Rank 0's hold on logging.metrics for the run's life (none without one, and elsewhere).
    std::unique_ptr<train::FileLock> metrics_lock;
    // Rank 0's tokenizer of the sample after training (logging.sample_tokens), loaded at
    // start-up so that a missing one is found before the run; none without a sample.
    std::unique_ptr<data::Tokenizer> sample_tokenizer;
};

// Where a run starts: step 0, or its checkpoint's step and skipped updates.
struct Start {
    int step = 0;
    int skipped_total = 0;
};

// "step_000004 is the newest checkpoint" or "no checkpoint has been written".
std::string newest_checkpoint(const config::Config& cfg);

// The training loop and what it holds between steps.
class Loop {
public:
    // `start`: where resume left the run; `lora`: what its checkpoints record of adapters.
    Loop(const Setup& setup, parallel::Grid& grid, parallel::World& world, train::Trainer& trainer,
         const train::LoraRecord& lora, const Peak& peak, Start start);

    // Runs the steps from the start to training.steps; false when a signal stopped them
    // (stopped_by() says which, agreed by every rank).
    bool run();
    int stopped_by() const { return signal_; }

    double first_val() const { return first_val_; }
    double last_val() const { return last_val_; }

private:
    void validate_first();
    bool stop_before_first_step();
    bool step(int s);
    void check_dir_kept(int step);
    train::StepMetrics metrics_of(int s, const train::StepResult& r);
    void check_health(const train::StepMetrics& m);
    bool stop_together(const train::StepMetrics& m, const std::string& metrics_failure,
                       std::string saved);

    std::string save(int step, bool last);

    const Setup& setup_;
    const config::Config& cfg_;
    parallel::Grid& grid_;
    parallel::World& world_;
    train::Trainer& trainer_;
    const train::LoraRecord& lora_;
    const Peak& peak_;
    const bool leader_;
    const int start_;
    int skipped_so_far_;
    bool said_nothing_counted_ = false;  // the note on a global batch without a counted token
    train::CollapseWatch collapse_;      // experts no token reached for many steps
    train::StepTimes step_times_;
    double first_val_ = 0, last_val_ = 0;
    int signal_ = 0;
    std::optional<train::MetricsLog> log_;
    std::optional<train::StragglerReport> stragglers_;
    train::AsyncCheckpoint async_;  // gone before the trainer whose share it may be writing
    const train::SampleFn train_sample_ = [this](uint64_t k, std::span<int32_t> in,
                                                 std::span<int32_t> tgt) {
        setup_.train_data->fill(k, in, tgt);
    };
    const train::SampleFn valid_sample_ = [this](uint64_t k, std::span<int32_t> in,
                                                 std::span<int32_t> tgt) {
        setup_.valid_data->fill(k, in, tgt);
    };
};

}  // namespace trident::commands
