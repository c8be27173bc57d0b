// Preemption: SIGTERM (scancel, a node going down) and SIGUSR1 (Slurm's --signal before the
// time limit) ask training to stop after the step under way, checkpointed.
//
// The handlers only record the signal (Slurm may send SIGTERM more than once; the first one
// counts). The trainer asks after each step, agreeing over the whole grid, so a signal that
// reached one rank stops every rank at the same step.
#pragma once

namespace trident::train {

// Installs the handlers (SA_RESTART, so MPI's system calls carry on).
void install_preemption_handlers();
// The signal received so far, or 0.
int preemption_signal();

}  // namespace trident::train
