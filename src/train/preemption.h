// Preemption and interruption: SIGTERM (scancel, a node going down) and SIGUSR1 (Slurm's
// --signal before the time limit) ask training to stop after the step under way,
// checkpointed; so does a first SIGINT (Ctrl-C), which also says on stderr that a second one
// aborts without saving. A second SIGINT ends the process at once, by that signal (exit code
// 130 in a shell). A process started with SIGINT ignored (nohup, a script's `&`) leaves it so.
//
// The handlers only record the signal (Slurm may send SIGTERM more than once; the first one
// counts). The trainer asks after each step, and before the first, agreeing over the whole
// grid, so a signal that reached one rank stops every rank at the same step. `train` installs
// them before anything else (MPI's start, the config, a resume's reads), so a signal in the
// first second is not the default's silent death.
#pragma once

namespace trident::train {

// Installs the handlers (SA_RESTART, so MPI's system calls carry on).
void install_preemption_handlers();
// Whether this process prints the Ctrl-C lines (world rank 0 alone: every rank of a job in
// the terminal's foreground gets the SIGINT). Until told, every process does.
void set_interrupt_speaker(bool speaks);
// Whether the stop a first Ctrl-C asks for saves a checkpoint (checkpoint.dir is set), as its
// line says. Until told, it does.
void set_interrupt_saves(bool saving);
// The signal received so far, or 0.
int preemption_signal();

}  // namespace trident::train
