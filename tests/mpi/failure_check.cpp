// The three ways a failure leaves a job (parallel/world.h), run by check_failure.sh under
// mpirun: `trident_mpi_failure_check MODE`, MODE one of
//   every_rank  every rank fails alike before communicating: one line from rank 0
//   agreed      the odd ranks fail at set-up, the last rank (when even) with its own reason
//   this_rank   the last rank fails while the others wait for it in a barrier: MPI_Abort
#include <cstdio>
#include <string>

#include "parallel/comm.h"
#include "parallel/world.h"

using namespace trident::parallel;

int main(int argc, char** argv) {
    World world(argc, argv);
    const std::string mode = argc > 1 ? argv[1] : "";
    const int rank = world.rank(), last = world.size() - 1;
    if (mode == "every_rank")
        return report_failure(world, "config.yaml:3: parallel.tensor must divide model.heads",
                              FailureKind::every_rank);
    if (mode == "agreed") {
        std::string error;
        if (rank % 2 == 1) error = "cannot read data/train.bin";
        if (rank == last && rank % 2 == 0 && rank > 0) error = "no GPU for local rank 2";
        if (any_rank_failed(world, !error.empty()))
            return report_failure(world, error, FailureKind::agreed);
        return 0;
    }
    if (mode == "this_rank") {
        if (rank == last)
            return report_failure(world, "step 3: out of memory", FailureKind::this_rank);
        world.comm().barrier();  // never completes: the last rank does not come
        std::fprintf(stderr, "rank %d passed a barrier it should not have\n", rank);
        return 0;
    }
    std::fprintf(stderr, "usage: trident_mpi_failure_check every_rank|agreed|this_rank\n");
    return 2;
}
