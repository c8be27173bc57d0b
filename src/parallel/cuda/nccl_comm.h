// NcclComm: a Comm for device buffers through NCCL, over the ranks of a host communicator.
//
// Collectives run on a stream of the communicator's own, ordered against the compute stream
// with events: the communication waits for the compute queued before the call, and compute
// queued after waits for the communication. The host returns at once (as kernels do); a
// copy to the host or a synchronisation sees the result. A non-blocking collective's buffers
// are recorded in use until it ends (kernels/cuda/stream_uses.h), so that a buffer released
// before its request is waited for is not reused under it. The separate stream is what lets a
// caller overlap communication with independent compute (e.g. a ZeRO-1 reduce-scatter with
// the rest of backward) once it asks for the result later than it starts it.
//
// Point-to-point messages on device buffers between ring neighbours (rank r and r ± 1: the
// pipeline's and ring attention's) go through NCCL, each direction on a communicator and stream
// of its own, matched by tag through envelopes on the host communicator (NcclMessages); other
// messages through the host communicator with host staging (StagedComm). Host buffers (the
// trainer's scalars, gathered checkpoints) go through the host communicator.
//
// Stalls. Each collective queued is noted for the stall watchdog, which names it when the host
// then waits too long for the device (parallel/watchdog.h); before the watchdog aborts the job
// it aborts every NCCL communicator (ncclCommAbort), freeing kernels that wait on a lost peer.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <utility>

#include "parallel/comm.h"
#include "parallel/cuda/nccl_messages.h"
#include "parallel/cuda/staged_comm.h"

namespace trident::parallel {

class NcclComm final : public Comm {
public:
    // Collective over the ranks of `host`, which it keeps for host buffers and messages. The
    // GPU must be chosen (gpu_binding.h) and not shared by two ranks of the group. With
    // `messages`, messages between ring neighbours travel through NCCL (NcclMessages, whose
    // communicators a group that sends none need not hold), else through the host.
    NcclComm(std::unique_ptr<Comm> host, cudaStream_t compute, bool messages);
    ~NcclComm() override;
    NcclComm(const NcclComm&) = delete;
    NcclComm& operator=(const NcclComm&) = delete;

    int rank() const override { return staged_.rank(); }
    int size() const override { return staged_.size(); }

    void all_reduce(kernels::Ptr data, std::size_t count, ReduceOp op = ReduceOp::sum) override;
    void reduce_scatter(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) override;
    void all_gather(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) override;
    void broadcast(kernels::Ptr data, std::size_t count, int root) override;
    // One ncclSend and one ncclRecv per rank of the group, in a group call.
    void all_to_all(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) override;
    void all_to_all_v(kernels::ConstPtr in, const std::vector<std::size_t>& send, kernels::Ptr out,
                      const std::vector<std::size_t>& recv) override;
    void send(kernels::ConstPtr data, std::size_t count, int peer, int tag) override;
    void recv(kernels::Ptr data, std::size_t count, int peer, int tag) override;
    void barrier() override;
    // Non-blocking: the collective is queued on the communication stream after the compute
    // queued so far, and waiting for it makes the compute stream wait for it (the host does
    // not). isend as send (above).
    Request isend(kernels::ConstPtr data, std::size_t count, int peer, int tag) override;
    // Between ring neighbours on device buffers: NCCL's send and receive, counted by the
    // caller (comm.h); else the staged communicator's.
    Request isendrecv(kernels::ConstPtr send, kernels::Ptr recv, std::size_t count, int dest,
                      int source, int tag) override;
    Request iall_reduce(kernels::Ptr data, std::size_t count, ReduceOp op = ReduceOp::sum) override;
    Request ireduce_scatter(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) override;
    Request iall_gather(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) override;
    Request iall_to_all_v(kernels::ConstPtr in, const std::vector<std::size_t>& send,
                          kernels::Ptr out, const std::vector<std::size_t>& recv) override;

private:
    class Pending;

    // all_to_all_v's sends and receives, one of each per rank in a group call, queued on the
    // communication stream.
    void send_blocks(kernels::ConstPtr in, const std::vector<std::size_t>& send, kernels::Ptr out,
                     const std::vector<std::size_t>& recv);
    // Whether a message travels through NcclMessages: a device buffer and a ring neighbour.
    bool by_nccl(const void* data, int peer, int tag) const;

    // Runs `collective` on the communication stream, between the events that order it
    // against the compute stream.
    // `operation` names it for the watchdog.
    template <typename Fn>
    void ordered(const char* operation, Fn collective);
    // Runs `collective` on the communication stream after the compute queued so far; the
    // request completes when it has. `buffers` (address, bytes) are what it reads and writes.
    using Buffers = std::initializer_list<std::pair<const void*, std::size_t>>;
    template <typename Fn>
    Request started(const char* operation, Buffers buffers, Fn collective);

    StagedComm staged_;
    std::unique_ptr<NcclMessages> messages_;  // with `messages` and more than one rank
    cudaStream_t compute_;
    cudaStream_t stream_ = nullptr;
    cudaEvent_t compute_done_ = nullptr, communication_done_ = nullptr;
    ncclComm_t comm_ = nullptr;
    int abort_hook_ = -1;  // parallel::add_abort_hook's id
};

}  // namespace trident::parallel
