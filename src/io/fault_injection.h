// Test-only faults: the failures the reliability tests need on demand (a disk that fills, a
// rank killed mid-save, a rank that throws or runs out of memory at a chosen step), each set by
// an environment variable. Each variable is read once; unset, as in every real run, a fault
// does nothing and costs one comparison. A malformed value is a trident::Error naming the
// variable and the form it takes, so a test never runs without the fault it asked for.
//
//   TRIDENT_TEST_WRITE_ERROR=TEXT:ERRNO[:COUNT]
//       a write to a file whose path contains TEXT writes half of its bytes and then fails
//       with ERRNO (a name such as ENOSPC, EIO, EDQUOT, or a number), as a filling disk does;
//       COUNT: only the first COUNT such writes of this process fail (default: every one).
//       Every file Trident writes goes through io::OutputFile, which asks write_error(), but
//       the optimizer state's offload file (optim/offload_store.h), which asks it too.
//   TRIDENT_TEST_READ_ERROR=TEXT:ERRNO[:SKIP]
//       a read from a file whose path contains TEXT fails with ERRNO once SKIP such reads of
//       this process have passed (default 0), as a failing disk would. Only the optimizer
//       state's offload file asks it.
//   TRIDENT_TEST_CRASH_IN_SAVE=STEP:RANK
//       world rank RANK, in the checkpoint save of step STEP, cuts its written shard to half
//       its size and dies by SIGKILL, as a rank lost in the middle of writing would.
//   TRIDENT_TEST_FAIL_AT_STEP=STEP:RANK:KIND
//       world rank RANK, as step STEP (1-based) begins, fails: KIND error throws a
//       trident::Error, oom throws std::bad_alloc, kill dies by SIGKILL.
//   TRIDENT_TEST_SLOW_RANK=RANK:MS
//       world rank RANK sleeps MS milliseconds as each step begins, as a rank on a slower or
//       busier device would take longer to compute.
//   TRIDENT_TEST_NAN_GRADIENT=FIRST[-LAST]:RANK
//       world rank RANK, in each of steps FIRST to LAST (1-based; LAST = FIRST if not given),
//       writes a NaN into its gradients as the backward announces the first of them final,
//       before any reduction over other ranks.
//   TRIDENT_TEST_CORRUPT_REPLICA=STEP:RANK:TENSOR
//       world rank RANK, as the replica check of step STEP begins, flips a bit of the first
//       element of its parameter TENSOR (e.g. h.0.ln_1.weight), as a bit flip in memory would.
#pragma once

#include <string>

namespace trident::io::fault {

// The errno a write of this process to `path` must fail with now (counting it), or 0.
int write_error(const std::string& path);

// The errno a read of this process from `path` must fail with now (counting it), or 0.
int read_error(const std::string& path);

// Whether world rank `rank` is to die in the save of `step` (TRIDENT_TEST_CRASH_IN_SAVE).
bool crash_in_save(int step, int rank);

// Fails as TRIDENT_TEST_FAIL_AT_STEP asks when (step, rank) is its own, and sleeps as
// TRIDENT_TEST_SLOW_RANK asks; else returns.
void at_step(int step, int rank);

// Whether world rank `rank` is to plant a NaN in its gradients in `step`
// (TRIDENT_TEST_NAN_GRADIENT).
bool nan_gradient(int step, int rank);

// The parameter world rank `rank` is to corrupt at the replica check of `step`
// (TRIDENT_TEST_CORRUPT_REPLICA), or "".
std::string corrupt_replica(int step, int rank);

// Checks every variable now, so a malformed one stops a run before it starts. Throws
// trident::Error naming the variable.
void check_settings();

}  // namespace trident::io::fault
