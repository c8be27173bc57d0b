// Collectives on device buffers through NCCL (see nccl_comm.h).
#include "parallel/cuda/nccl_comm.h"

#include <numeric>
#include <string>
#include <utility>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/stream_uses.h"
#include "kernels/error.h"
#include "parallel/cuda/device_memory.h"
#include "parallel/cuda/nccl_messages.h"
#include "parallel/cuda/nccl_support.h"
#include "parallel/watchdog.h"

namespace trident::parallel {

using kernels::ConstPtr;
using kernels::DType;
using kernels::Ptr;

namespace {

std::size_t bytes(std::size_t count, DType type) {
    return count * kernels::size_of(type);
}

}  // namespace

NcclComm::NcclComm(std::unique_ptr<Comm> host, cudaStream_t compute, bool messages)
    : staged_(std::move(host), compute), compute_(compute) {
    if (size() == 1) return;  // nothing to exchange: every call returns at once
    // Rank 0's NCCL id reaches the others as bytes through the host communicator.
    ncclUniqueId id{};
    if (rank() == 0) TRIDENT_NCCL_CHECK(ncclGetUniqueId(&id));
    staged_.broadcast(Ptr(&id, DType::u8), sizeof(id), 0);
    TRIDENT_NCCL_CHECK(ncclCommInitRank(&comm_, size(), id, rank()));
    TRIDENT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    TRIDENT_CUDA_CHECK(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming));
    TRIDENT_CUDA_CHECK(cudaEventCreateWithFlags(&communication_done_, cudaEventDisableTiming));
    abort_hook_ = add_abort_hook([comm = comm_] { ncclCommAbort(comm); });
    if (messages) messages_ = std::make_unique<NcclMessages>(staged_, compute_);
}

NcclComm::~NcclComm() {
    messages_.reset();
    if (abort_hook_ >= 0) remove_abort_hook(abort_hook_);
    if (stream_) cudaStreamSynchronize(stream_);
    if (comm_) ncclCommDestroy(comm_);
    if (communication_done_) cudaEventDestroy(communication_done_);
    if (compute_done_) cudaEventDestroy(compute_done_);
    if (stream_) cudaStreamDestroy(stream_);
}

template <typename Fn>
void NcclComm::ordered(const char* operation, Fn collective) {
    note_device_collective(operation, label());
    TRIDENT_CUDA_CHECK(cudaEventRecord(compute_done_, compute_));
    TRIDENT_CUDA_CHECK(cudaStreamWaitEvent(stream_, compute_done_, 0));
    collective();
    TRIDENT_CUDA_CHECK(cudaEventRecord(communication_done_, stream_));
    TRIDENT_CUDA_CHECK(cudaStreamWaitEvent(compute_, communication_done_, 0));
}

void NcclComm::all_reduce(Ptr data, std::size_t count, ReduceOp op) {
    if (size() == 1) return;
    Comm::count(CommKind::all_reduce, count, data.dtype);
    if (!on_device(data.data)) return staged_.all_reduce(data, count, op);
    ordered("all_reduce", [&] {
        TRIDENT_NCCL_CHECK(ncclAllReduce(data.data, data.data, count,
                                         nccl_reduction_type(data.dtype),
                                         op == ReduceOp::max ? ncclMax : ncclSum, comm_, stream_));
    });
}

void NcclComm::reduce_scatter(ConstPtr in, Ptr out, std::size_t count) {
    if (size() == 1) return staged_.reduce_scatter(in, out, count);  // a copy, if any
    Comm::count(CommKind::reduce_scatter, count * size(), out.dtype);
    if (!on_device(out.data)) return staged_.reduce_scatter(in, out, count);
    // NCCL takes the output at this rank's block of the input (in place) as ZeRO-1 passes it.
    ordered("reduce_scatter", [&] {
        TRIDENT_NCCL_CHECK(ncclReduceScatter(
            in.data, out.data, count, nccl_reduction_type(out.dtype), ncclSum, comm_, stream_));
    });
}

void NcclComm::all_gather(ConstPtr in, Ptr out, std::size_t count) {
    if (size() == 1) return staged_.all_gather(in, out, count);  // a copy, if any
    Comm::count(CommKind::all_gather, count, out.dtype);
    if (!on_device(out.data)) return staged_.all_gather(in, out, count);
    ordered("all_gather", [&] {
        TRIDENT_NCCL_CHECK(
            ncclAllGather(in.data, out.data, count, nccl_type(out.dtype), comm_, stream_));
    });
}

void NcclComm::broadcast(Ptr data, std::size_t count, int root) {
    if (size() == 1) return staged_.broadcast(data, count, root);  // checks the root
    Comm::count(CommKind::broadcast, count, data.dtype);
    if (!on_device(data.data)) return staged_.broadcast(data, count, root);
    ordered("broadcast", [&] {
        TRIDENT_NCCL_CHECK(ncclBroadcast(data.data, data.data, count, nccl_type(data.dtype), root,
                                         comm_, stream_));
    });
}

void NcclComm::all_to_all(ConstPtr in, Ptr out, std::size_t count) {
    if (size() == 1) return staged_.all_to_all(in, out, count);  // a copy
    Comm::count(CommKind::all_to_all, count * size(), out.dtype);
    if (!on_device(out.data)) return staged_.all_to_all(in, out, count);
    const ncclDataType_t type = nccl_type(out.dtype);
    ordered("all_to_all", [&] {
        NcclGroup group;
        for (int peer = 0; peer < size(); ++peer) {
            const std::size_t block = static_cast<std::size_t>(peer) * count;
            TRIDENT_NCCL_CHECK(ncclSend((in + block).data, count, type, peer, comm_, stream_));
            TRIDENT_NCCL_CHECK(ncclRecv((out + block).data, count, type, peer, comm_, stream_));
        }
        group.end();
    });
}

void NcclComm::all_to_all_v(ConstPtr in, const std::vector<std::size_t>& send, Ptr out,
                            const std::vector<std::size_t>& recv) {
    if (size() == 1 || !on_device(out.data)) return staged_.all_to_all_v(in, send, out, recv);
    Comm::count(CommKind::all_to_all, std::accumulate(send.begin(), send.end(), std::size_t{0}),
                out.dtype);
    ordered("all_to_all_v", [&] { send_blocks(in, send, out, recv); });
}

Request NcclComm::iall_to_all_v(ConstPtr in, const std::vector<std::size_t>& send, Ptr out,
                                const std::vector<std::size_t>& recv) {
    if (size() == 1 || !on_device(out.data)) {
        all_to_all_v(in, send, out, recv);
        return {};
    }
    const std::size_t sent = std::accumulate(send.begin(), send.end(), std::size_t{0});
    const std::size_t received = std::accumulate(recv.begin(), recv.end(), std::size_t{0});
    Comm::count(CommKind::all_to_all, sent, out.dtype);
    return started("all_to_all_v",
                   {{in.data, bytes(sent, in.dtype)}, {out.data, bytes(received, out.dtype)}},
                   [&] { send_blocks(in, send, out, recv); });
}

void NcclComm::send_blocks(ConstPtr in, const std::vector<std::size_t>& send, Ptr out,
                           const std::vector<std::size_t>& recv) {
    const ncclDataType_t type = nccl_type(out.dtype);
    NcclGroup group;
    std::size_t at_send = 0, at_recv = 0;
    for (int peer = 0; peer < size(); ++peer) {
        const std::size_t q = static_cast<std::size_t>(peer);
        if (send[q] > 0)
            TRIDENT_NCCL_CHECK(ncclSend((in + at_send).data, send[q], type, peer, comm_, stream_));
        if (recv[q] > 0)
            TRIDENT_NCCL_CHECK(ncclRecv((out + at_recv).data, recv[q], type, peer, comm_, stream_));
        at_send += send[q];
        at_recv += recv[q];
    }
    group.end();
}

// Messages: on device buffers between ring neighbours through NCCL (NcclMessages), else
// through the host communicator with staging (see nccl_comm.h). Every call is counted here,
// as the trainer reads this communicator's statistics.
bool NcclComm::by_nccl(const void* data, int peer, int tag) const {
    if (!messages_ || !messages_->carries(peer)) return false;
    if (on_device(data)) return true;
    if (tag == NcclMessages::kTag)
        throw Error("internal: tag " + std::to_string(tag) +
                    " on a host message between neighbours: NCCL's envelopes use it");
    return false;
}

void NcclComm::send(ConstPtr data, std::size_t count, int peer, int tag) {
    Comm::count(CommKind::send, count, data.dtype);
    if (by_nccl(data.data, peer, tag))
        return messages_->isend(data, count, peer, tag, label()).wait();
    staged_.send(data, count, peer, tag);
}

void NcclComm::recv(Ptr data, std::size_t count, int peer, int tag) {
    Comm::count(CommKind::recv, count, data.dtype);
    if (by_nccl(data.data, peer, tag)) return messages_->recv(data, count, peer, tag, label());
    staged_.recv(data, count, peer, tag);
}

Request NcclComm::isend(ConstPtr data, std::size_t count, int peer, int tag) {
    Comm::count(CommKind::send, count, data.dtype);
    if (by_nccl(data.data, peer, tag)) return messages_->isend(data, count, peer, tag, label());
    return staged_.isend(data, count, peer, tag);
}

Request NcclComm::isendrecv(ConstPtr send, Ptr recv, std::size_t count, int dest, int source,
                            int tag) {
    if (!by_nccl(send.data, dest, tag) || !by_nccl(recv.data, source, tag))
        return staged_.isendrecv(send, recv, count, dest, source, tag);
    Request sent = messages_->isend(send, count, dest, tag, label());
    messages_->recv(recv, count, source, tag, label());
    sent.wait();
    return {};
}

// A collective queued on the communication stream: complete when its event has happened;
// waiting makes the compute stream wait for that event. The event is shared with the record of
// the collective's buffers (stream_uses.h).
class NcclComm::Pending final : public Request::Pending {
public:
    Pending(kernels::cuda::SharedEvent done, cudaStream_t compute)
        : done_(std::move(done)), compute_(compute) {}
    bool test() override {
        const cudaError_t status = cudaEventQuery(done_.get());
        if (status == cudaErrorNotReady) return false;
        TRIDENT_CUDA_CHECK(status);
        return true;
    }
    void wait() override { TRIDENT_CUDA_CHECK(cudaStreamWaitEvent(compute_, done_.get(), 0)); }

private:
    kernels::cuda::SharedEvent done_;
    cudaStream_t compute_;
};

template <typename Fn>
Request NcclComm::started(const char* operation, Buffers buffers, Fn collective) {
    note_device_collective(operation, label());
    TRIDENT_CUDA_CHECK(cudaEventRecord(compute_done_, compute_));
    TRIDENT_CUDA_CHECK(cudaStreamWaitEvent(stream_, compute_done_, 0));
    collective();
    // Until the request is waited for, nothing orders the compute stream after the collective:
    // its buffers are recorded in use, so that the allocator does not hand them out meanwhile.
    return Request(
        std::make_unique<Pending>(kernels::cuda::record_stream_use(stream_, buffers), compute_));
}

Request NcclComm::iall_reduce(Ptr data, std::size_t count, ReduceOp op) {
    if (size() == 1) return {};
    Comm::count(CommKind::all_reduce, count, data.dtype);
    if (!on_device(data.data)) return staged_.iall_reduce(data, count, op);
    return started("all_reduce", {{data.data, bytes(count, data.dtype)}}, [&] {
        TRIDENT_NCCL_CHECK(ncclAllReduce(data.data, data.data, count,
                                         nccl_reduction_type(data.dtype),
                                         op == ReduceOp::max ? ncclMax : ncclSum, comm_, stream_));
    });
}

Request NcclComm::ireduce_scatter(ConstPtr in, Ptr out, std::size_t count) {
    if (size() == 1) return staged_.ireduce_scatter(in, out, count);  // a copy, if any
    Comm::count(CommKind::reduce_scatter, count * size(), out.dtype);
    if (!on_device(out.data)) return staged_.ireduce_scatter(in, out, count);
    return started(
        "reduce_scatter",
        {{in.data, bytes(count * size(), in.dtype)}, {out.data, bytes(count, out.dtype)}}, [&] {
            TRIDENT_NCCL_CHECK(ncclReduceScatter(
                in.data, out.data, count, nccl_reduction_type(out.dtype), ncclSum, comm_, stream_));
        });
}

Request NcclComm::iall_gather(ConstPtr in, Ptr out, std::size_t count) {
    if (size() == 1) return staged_.iall_gather(in, out, count);  // a copy, if any
    Comm::count(CommKind::all_gather, count, out.dtype);
    if (!on_device(out.data)) return staged_.iall_gather(in, out, count);
    return started(
        "all_gather",
        {{in.data, bytes(count, in.dtype)}, {out.data, bytes(count * size(), out.dtype)}}, [&] {
            TRIDENT_NCCL_CHECK(
                ncclAllGather(in.data, out.data, count, nccl_type(out.dtype), comm_, stream_));
        });
}

void NcclComm::barrier() {
    staged_.barrier();
}

}  // namespace trident::parallel
