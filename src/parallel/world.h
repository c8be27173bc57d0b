// World: the MPI runtime of one trident process, and how a failure leaves it without a hang.
//
// main() constructs one World before anything else that communicates and keeps it to the
// end; its destructor finalises MPI, so every Grid and Comm must be gone by then. A run
// without mpirun is a world of one process (MPI's singleton start).
//
// Failures. A rank that meets an error must not leave its peers waiting in a collective,
// and a user should see one clear line, not one per rank. Which helper to call depends on
// what the other ranks know:
//
//   1. Every rank hits the same error before any communication (the config: all ranks parse
//      the same file and validate it the same way):
//        catch (const Error& e) {
//            return report_failure(world, e.what(), FailureKind::every_rank);
//        }
//      Rank 0 prints `trident: error: MESSAGE`; every rank returns 1 and finalises normally.
//
//   2. Set-up that some ranks may fail and others not (a data file one node cannot read,
//      a device one rank cannot open): every rank runs its set-up, catches its own error,
//      and then all agree before the first collective of training:
//        std::string error;                       // empty: this rank succeeded
//        try { ... } catch (const std::exception& e) { error = e.what(); }
//        if (any_rank_failed(world, !error.empty()))
//            return report_failure(world, error, FailureKind::agreed);
//      Rank 0 prints each distinct message once, naming the ranks that hit it (none when all
//      ranks did); every rank returns 1 and finalises normally.
//
//   3. Anything else, above all an exception in the middle of training while peers wait in
//      a collective or a recv:
//        catch (const std::exception& e) {
//            return report_failure(world, e.what(), FailureKind::this_rank);
//        }
//      This rank prints `trident: error: rank R: MESSAGE` and calls MPI_Abort, which ends
//      every rank of the job. In a world of one it prints `trident: error: MESSAGE` and
//      returns 1 instead (there is no peer to free, and no abort banner to print).
//
// An exception must never leave main() on one rank only: World's destructor would then
// call MPI_Finalize, which waits for the peers that wait for this rank.
#pragma once

#include <memory>
#include <string>

namespace trident::parallel {

class Comm;
class MpiComm;

class World {
public:
    // MPI_Init_thread(MPI_THREAD_MULTIPLE): the main thread and communicators' workers call
    // MPI. Throws trident::Error if MPI is already initialised (one World a process).
    World(int& argc, char**& argv);
    ~World();  // MPI_Finalize
    World(const World&) = delete;
    World& operator=(const World&) = delete;

    int rank() const { return rank_; }
    int size() const { return size_; }
    // Rank among the processes of this node (MPI_COMM_TYPE_SHARED), e.g. to pick a GPU.
    int local_rank() const { return local_rank_; }
    int local_size() const { return local_size_; }

    Comm& comm();         // every process (MPI_COMM_WORLD)
    MpiComm& mpi_comm();  // the same, as MPI: Grid splits it into groups

private:
    int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
    std::unique_ptr<MpiComm> comm_;
};

enum class FailureKind {
    every_rank,  // every rank hit this same error before communicating: rank 0 prints it
    agreed,      // after any_rank_failed() returned true; message empty where this rank succeeded
    this_rank,   // only this rank may know: print with the rank and MPI_Abort the job
};

// Prints the failure as the kind requires (see the top of this file) and returns the exit
// code for main, 1. With FailureKind::this_rank in a world of more than one it does not
// return. Collective for every_rank (no communication, but every rank must call it) and
// agreed (communicates over MPI_COMM_WORLD).
int report_failure(World& world, const std::string& message, FailureKind kind);

// Whether `failed` is true on any rank (an MPI_Allreduce over MPI_COMM_WORLD): lets every
// rank agree, after a set-up phase, whether all succeeded. Collective.
bool any_rank_failed(World& world, bool failed);

}  // namespace trident::parallel
