// NcclMessages: NcclComm's point-to-point messages on device buffers between ring neighbours
// (rank r and r ± 1 mod n of the group: every message of the pipeline and of ring attention),
// through NCCL rather than host memory.
//
// Comm's messages match by tag, and a non-blocking send must never hold up its sender; NCCL
// matches a pair's sends to its receives by their order alone, and an ncclSend holds its
// stream until the peer's ncclRecv runs. So:
// - each direction between two neighbours (r to r+1, r to r-1) is a two-rank NCCL communicator
//   with a stream of its own at each end: a message waits for its own receive only, never
//   behind another direction's;
// - every send is announced by an envelope (tag, count, type) through the host communicator,
//   in the order of the sends. A receive takes the envelopes in that order and receives each
//   message with NCCL in that same order; one that is not the message asked for goes to a
//   device buffer of its own (stream-ordered cudaMallocAsync) until its receive comes (the
//   two-stage interleaved pipeline's messages come in an order of their own).
//
// Ordering with the compute stream, as NcclComm's collectives: a send reads its buffer after
// the compute queued before it, and waiting for its request makes the compute stream wait
// for it; a receive writes after the compute queued before it, and compute queued after it
// waits for it. The host waits only for envelopes: a receive for its own and those before it,
// as an MPI receive waits for its message.
//
// The set-up is collective over the group: the directed neighbour pairs, in one order on
// every rank, each get their communicator in turn (the first of them unfinished has both its
// ranks waiting for it, so every one completes).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "parallel/comm.h"

namespace trident::parallel {

class NcclMessages {
public:
    // The host communicator carries the set-up and the envelopes (host buffers only), with
    // the tag kTag, which host messages between neighbours must not use.
    static constexpr int kTag = 32767;

    NcclMessages(Comm& host, cudaStream_t compute);
    ~NcclMessages();
    NcclMessages(const NcclMessages&) = delete;
    NcclMessages& operator=(const NcclMessages&) = delete;

    // Whether messages with `peer` travel here (a ring neighbour of this rank).
    bool carries(int peer) const;
    // `group` names the communicator for the stall watchdog.
    Request isend(kernels::ConstPtr data, std::size_t count, int peer, int tag,
                  const GroupLabel* group);
    void recv(kernels::Ptr data, std::size_t count, int peer, int tag, const GroupLabel* group);

private:
    struct Stashed {
        void* data;
        std::size_t count;
        kernels::DType dtype;
        cudaEvent_t arrived;
    };
    // One direction with one neighbour: this rank is rank 0 of `comm` when it sends on it.
    // Its destructor gives back everything it holds.
    struct Link {
        Link() = default;
        ~Link();
        Link(const Link&) = delete;
        Link& operator=(const Link&) = delete;
        int peer = -1;
        bool sending = false;
        ncclComm_t comm = nullptr;
        cudaStream_t stream = nullptr;
        cudaEvent_t ready = nullptr, done = nullptr;
        int abort_hook = -1;
        std::multimap<int64_t, Stashed> stash;  // receiving: arrived before asked for, by tag
    };

    Link* find(int peer, bool sending);
    Link& link(int peer, bool sending);
    // NCCL receives `count` elements of `dtype` into `data` on the link, after the compute
    // queued so far; `arrived` is recorded after it.
    void receive(Link& link, void* data, std::size_t count, kernels::DType dtype,
                 cudaEvent_t arrived);

    Comm& host_;
    cudaStream_t compute_;
    std::vector<std::unique_ptr<Link>> links_;
};

}  // namespace trident::parallel
