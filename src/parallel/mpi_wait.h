// Waits for MPI requests without holding the core, for the worker of the MPI communicator
// (parallel/mpi_comm.h), which shares the rank's cores with the compute it overlaps. Open MPI
// and MPICH poll inside a blocking call until it completes, so a worker blocked there would
// take the core from the compute for the whole wait, however late the peer
// (docs/PERF.md, "The overlaps on a CPU rank").
#pragma once

#include <mpi.h>

#include <vector>

namespace trident::parallel {

// MPI_Testall in a loop for the first 200 µs (a peer on its core answers within microseconds,
// as a ring's steps need), then with sleeps growing from 1 µs to 100 µs between tests. MPI
// moves the data in each test.
void wait_sleeping(std::vector<MPI_Request>& requests);

// Returns once every rank of `comm` has called it (an MPI_Ibarrier, waited for as above): a
// blocking call after it polls only while its data moves, not while a late peer is on its way.
void wait_for_peers(MPI_Comm comm);

}  // namespace trident::parallel
