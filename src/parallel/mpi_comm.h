// MpiComm: Comm over an MPI communicator, for buffers in host memory. Each element type
// travels as its MPI type (fp32 as MPI_FLOAT, doubles as MPI_DOUBLE, integers as the
// fixed-width integer types); bf16 and fp16 as 16-bit words, summed by MPI operations of our
// own that add in fp32 and round each partial sum to the type (to nearest even).
//
// Determinism. Every call gives bitwise the same output for the same inputs on the same
// layout: MPI picks its algorithm from the group size and the message size only, and each
// algorithm adds in a fixed order. all_reduce also gives bitwise the same output on every
// rank of the group, which the model needs (tensor-parallel replicas of LayerNorm must not
// drift apart). MPI does not promise this, but the algorithms of Open MPI and MPICH keep it:
// ring and reduce-scatter + all-gather reduce each element on one rank and then copy it;
// recursive doubling adds two partial sums on both sides in rank order (and a + b == b + a
// holds bitwise in IEEE arithmetic); reduce + broadcast copies. tests/mpi checks it.
//
// Sizes. MPI counts are ints; calls on more than `max_chunk` elements are split into pieces
// of at most that many (results are unchanged: every reduction is element by element). The
// traffic counters count each call once, with its whole size.
//
// In place. As NCCL allows: reduce_scatter's out may be this rank's own block of in
// (in + rank*count), and all_gather's in may be this rank's own block of out
// (out + rank*count). Other overlaps work through a scratch copy (except in a reduce_scatter
// split into pieces, which throws).
//
// Non-blocking collectives. MPI's own (MPI_Ireduce_scatter_block, ...) add in another order
// than the blocking calls, so a reduction would change in its last bits with the overlap.
// Instead a worker thread of this communicator runs each call on a duplicate of the group,
// one call after another in the order they were started; the caller computes meanwhile. This needs
// MPI_THREAD_MULTIPLE (World asks for it); where MPI offers less, the call runs at once and returns
// done. isend is MPI_Isend.
//
// The worker's waits. A blocking MPI call polls until its peers arrive, and the worker shares
// the rank's core (or cores) with the compute it overlaps. So the calls that only move data
// (all_gather, all_to_all_v, sendrecv) run as MPI's non-blocking ones there, and the worker
// tests them for 200 µs, then sleeps between tests: the same bytes land, a peer that is there
// answers at once, and a late one leaves the core to the compute. The reductions keep the
// blocking call for its order of addition, as above, but the worker first waits so for the
// group's ranks to arrive (MPI_Ibarrier): the blocking call then polls only while the data
// moves.
//
// Stalls. Every blocking call, and every wait for a request, marks the rank as waiting for
// the stall watchdog (watchdog.h), under the group's label: "world" for MPI_COMM_WORLD, or
// the name set_name gives it.
#pragma once

#include <mpi.h>

#include <climits>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "parallel/comm.h"

namespace trident::parallel {

class MpiComm final : public Comm {
public:
    // The largest piece one MPI call moves: the largest int count, rounded down to 4 KiB.
    static constexpr std::size_t kMaxChunk = std::size_t{INT_MAX} & ~std::size_t{1023};

    // Takes ownership of `comm` (MPI_Comm_free in the destructor, unless it is
    // MPI_COMM_WORLD). A smaller max_chunk is for tests of the splitting.
    explicit MpiComm(MPI_Comm comm, std::size_t max_chunk = kMaxChunk);
    ~MpiComm() override;
    MpiComm(const MpiComm&) = delete;
    MpiComm& operator=(const MpiComm&) = delete;

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    MPI_Comm handle() const { return comm_; }
    // Labels the group for the watchdog's messages: `name` and its members' world ranks.
    void set_name(std::string name);

    void all_reduce(kernels::Ptr data, std::size_t count, ReduceOp op = ReduceOp::sum) override;
    void reduce_scatter(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) override;
    void all_gather(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) override;
    void broadcast(kernels::Ptr data, std::size_t count, int root) override;
    void all_to_all(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) override;
    void all_to_all_v(kernels::ConstPtr in, const std::vector<std::size_t>& send, kernels::Ptr out,
                      const std::vector<std::size_t>& recv) override;
    // send is synchronous (MPI_Ssend): it returns once the peer's recv has begun, whatever
    // the size. A schedule that orders sends and recvs wrongly thus deadlocks in a small
    // test, not only when messages grow past MPI's eager limit.
    void send(kernels::ConstPtr data, std::size_t count, int peer, int tag) override;
    void recv(kernels::Ptr data, std::size_t count, int peer, int tag) override;
    void barrier() override;
    Request isend(kernels::ConstPtr data, std::size_t count, int peer, int tag) override;
    Request iall_reduce(kernels::Ptr data, std::size_t count, ReduceOp op = ReduceOp::sum) override;
    Request ireduce_scatter(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) override;
    Request iall_gather(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) override;
    Request iall_to_all_v(kernels::ConstPtr in, const std::vector<std::size_t>& send,
                          kernels::Ptr out, const std::vector<std::size_t>& recv) override;
    // MPI_Irecv and MPI_Isend, which the worker waits for as the non-blocking collectives.
    Request isendrecv(kernels::ConstPtr send, kernels::Ptr recv, std::size_t count, int dest,
                      int source, int tag) override;

private:
    // The collectives themselves, on `comm` with `scratch` (the caller's or the worker's).
    void all_reduce_on(MPI_Comm comm, kernels::Ptr data, std::size_t count, ReduceOp op) const;
    void reduce_scatter_on(MPI_Comm comm, std::vector<char>& scratch, kernels::ConstPtr in,
                           kernels::Ptr out, std::size_t count) const;
    // How the data-only ones wait: in MPI's blocking call, or sleeping between tests.
    enum class Wait { blocking, sleeping };
    void all_gather_on(MPI_Comm comm, std::vector<char>& scratch, kernels::ConstPtr in,
                       kernels::Ptr out, std::size_t count, Wait wait) const;
    void all_to_all_v_on(MPI_Comm comm, kernels::ConstPtr in, const std::vector<std::size_t>& send,
                         kernels::Ptr out, const std::vector<std::size_t>& recv, Wait wait) const;
    // Runs `call` on the worker (or at once without MPI_THREAD_MULTIPLE); done when it is.
    // `operation` names it while the caller waits for it.
    Request start(const char* operation, std::function<void()> call);
    void worker_loop();

    template <typename Fn>
    void for_each_message(std::size_t count, Fn fn) const;  // fn(offset, n) per message
    void check_peer(int peer, const char* call) const;
    void check_tag(int tag, const char* call) const;
    void check_root(int root) const;

    MPI_Comm comm_;
    int rank_ = 0, size_ = 1;
    int tag_upper_bound_ = 32767;  // MPI_TAG_UB; MPI guarantees at least this
    std::size_t max_chunk_;
    std::vector<char> scratch_;  // for overlapping buffers and split reduce-scatters

    // The worker of the non-blocking collectives, started with the first one.
    MPI_Comm worker_comm_ = MPI_COMM_NULL;  // the duplicate of comm_ it calls MPI on
    std::vector<char> worker_scratch_;
    std::thread worker_;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::deque<std::function<void()>> calls_;  // started, not yet run
    bool stopping_ = false;
};

}  // namespace trident::parallel
