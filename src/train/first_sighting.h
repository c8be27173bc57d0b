// Where a step's non-finite loss or gradients were first seen: on which rank, of which
// pipeline stage (docs/ARCHITECTURE.md, "Bad steps"). The step's loss and gradient norm are
// reduced over the whole grid, so once any rank holds a NaN every rank's figures are NaN and
// say nothing of where it came from. Each rank therefore notes its own: the loss of its own
// microbatches (the last stage), and its own gradients as the backward announces each range
// final, before the data-parallel reduction mixes them with its replicas' (a sum of squares
// on the device, read once; what Megatron-LM's check before its gradient reduction does).
// Only a step found non-finite asks every rank what it saw: one small collective then, none
// in a step that is fine.
#pragma once

#include <string>

#include "data_parallel/data_parallel.h"
#include "kernels/device_buffer.h"
#include "kernels/ops.h"
#include "parallel/comm.h"
#include "parallel/grid.h"

namespace trident::train {

class FirstSighting final : public data_parallel::GradientObserver {
public:
    // `grid`: this rank's (one process: nobody else to name, and nothing is noted). The groups
    // are the trainer's, which together span the grid.
    FirstSighting(kernels::Ops& ops, const parallel::Grid& grid, parallel::Comm& tensor,
                  parallel::Comm& pipeline, parallel::Comm& data_context);

    // A step (1-based) begins: nothing seen yet.
    void start_step(int step);
    // `count` of this rank's gradients at `grads` are final for the step (before any
    // reduction over other ranks). Plants the test fault TRIDENT_TEST_NAN_GRADIENT.
    void grads_final(kernels::Ptr grads, std::size_t count) override;
    // The sum of the losses of this rank's own microbatches (the last stage's; 0 elsewhere).
    void own_loss(double loss_sum) { loss_seen_ = !std::isfinite(loss_sum); }

    // Which rank first (the lowest rank) saw a non-finite loss, and which non-finite
    // gradients, as a phrase for the step's message ("" in a world of one). Collective over
    // the three groups.
    std::string find();

private:
    kernels::Ops& ops_;
    parallel::GridShape shape_;
    int rank_ = 0;
    bool watching_ = false;  // more than one rank
    parallel::Comm& tensor_;
    parallel::Comm& pipeline_;
    parallel::Comm& data_context_;
    kernels::DeviceBuffer sum_;  // (1) f64: this rank's gradients' sum of squares in the step
    int step_ = 0;
    bool planted_ = false;  // the test fault's NaN, in this step
    bool loss_seen_ = false;
};

}  // namespace trident::train
