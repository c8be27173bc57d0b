// Waiting for MPI requests in tests and sleeps (see mpi_wait.h).
#include "parallel/mpi_wait.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "parallel/mpi_types.h"

namespace trident::parallel {

void wait_sleeping(std::vector<MPI_Request>& requests) {
    using std::chrono::microseconds;
    const auto polled_until = std::chrono::steady_clock::now() + microseconds{200};
    microseconds pause{1};
    for (;;) {
        int done = 0;
        check_mpi(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done,
                              MPI_STATUSES_IGNORE),
                  "MPI_Testall");
        if (done) return;
        if (std::chrono::steady_clock::now() < polled_until) continue;
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, microseconds{100});
    }
}

void wait_for_peers(MPI_Comm comm) {
    std::vector<MPI_Request> barrier(1);
    check_mpi(MPI_Ibarrier(comm, barrier.data()), "MPI_Ibarrier");
    wait_sleeping(barrier);
}

}  // namespace trident::parallel
