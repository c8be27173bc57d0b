// Point-to-point messages between ring neighbours through NCCL (see nccl_messages.h).
#include "parallel/cuda/nccl_messages.h"

#include <algorithm>
#include <array>
#include <set>
#include <string>
#include <utility>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/stream_uses.h"
#include "kernels/error.h"
#include "parallel/cuda/nccl_support.h"
#include "parallel/watchdog.h"

namespace trident::parallel {

using kernels::ConstPtr;
using kernels::DType;
using kernels::Ptr;

namespace {

// What a send announces: its tag, element count and element type.
using Envelope = std::array<int64_t, 3>;

cudaEvent_t new_event() {
    cudaEvent_t event = nullptr;
    TRIDENT_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return event;
}

// A send under way: its envelope (kept until the host has sent it) and the event after its
// ncclSend, shared with the record of its buffer (kernels/cuda/stream_uses.h). Waiting makes
// the compute stream wait for that event, so compute queued after the wait may write the
// buffer.
class SendPending final : public Request::Pending {
public:
    SendPending(std::unique_ptr<Envelope> envelope, Request announced,
                kernels::cuda::SharedEvent sent, cudaStream_t compute)
        : envelope_(std::move(envelope)),
          announced_(std::move(announced)),
          sent_(std::move(sent)),
          compute_(compute) {}
    ~SendPending() override {
        announced_ = Request();  // waits for the envelope, which must outlive its send
    }
    bool test() override {
        if (!announced_.test()) return false;
        const cudaError_t status = cudaEventQuery(sent_.get());
        if (status == cudaErrorNotReady) return false;
        TRIDENT_CUDA_CHECK(status);
        return true;
    }
    void wait() override {
        announced_.wait();
        TRIDENT_CUDA_CHECK(cudaStreamWaitEvent(compute_, sent_.get(), 0));
    }

private:
    std::unique_ptr<Envelope> envelope_;
    Request announced_;
    kernels::cuda::SharedEvent sent_;
    cudaStream_t compute_;
};

}  // namespace

NcclMessages::NcclMessages(Comm& host, cudaStream_t compute) : host_(host), compute_(compute) {
    const int n = host.size(), me = host.rank();
    // The directed pairs of ring neighbours, ordered alike on every rank.
    std::set<std::pair<int, int>> pairs;
    for (int r = 0; n > 1 && r < n; ++r) {
        pairs.insert({r, (r + 1) % n});
        pairs.insert({r, (r + n - 1) % n});
    }
    // A one-byte message that makes NCCL connect each pair now.
    void* probe = nullptr;
    TRIDENT_CUDA_CHECK(cudaMalloc(&probe, 1));
    const std::unique_ptr<void, cudaError_t (*)(void*)> probe_memory(probe, cudaFree);
    for (const auto& [from, to] : pairs) {
        if (from != me && to != me) continue;
        // Kept at once, so that a failure below still frees what the link holds.
        Link& link = *links_.emplace_back(std::make_unique<Link>());
        link.sending = from == me;
        link.peer = link.sending ? to : from;
        ncclUniqueId id{};
        if (link.sending) {
            TRIDENT_NCCL_CHECK(ncclGetUniqueId(&id));
            host.send(ConstPtr(&id, DType::u8), sizeof(id), to, kTag);
        } else {
            host.recv(Ptr(&id, DType::u8), sizeof(id), from, kTag);
        }
        TRIDENT_NCCL_CHECK(ncclCommInitRank(&link.comm, 2, id, link.sending ? 0 : 1));
        link.abort_hook = add_abort_hook([comm = link.comm] { ncclCommAbort(comm); });
        TRIDENT_CUDA_CHECK(cudaStreamCreateWithFlags(&link.stream, cudaStreamNonBlocking));
        link.ready = new_event();
        link.done = new_event();
        // NCCL connects a pair on its first message, which would otherwise come in the middle
        // of a step, its host waiting for the peer's host there.
        if (link.sending)
            TRIDENT_NCCL_CHECK(ncclSend(probe, 1, ncclUint8, 1, link.comm, link.stream));
        else
            TRIDENT_NCCL_CHECK(ncclRecv(probe, 1, ncclUint8, 0, link.comm, link.stream));
        TRIDENT_CUDA_CHECK(cudaStreamSynchronize(link.stream));
    }
}

NcclMessages::~NcclMessages() = default;

NcclMessages::Link::~Link() {
    // Nothing may throw here.
    if (abort_hook >= 0) remove_abort_hook(abort_hook);
    if (stream) cudaStreamSynchronize(stream);
    for (auto& [tag, stashed] : stash) {
        cudaFree(stashed.data);  // the pool's block, freed at once (its stream is idle)
        cudaEventDestroy(stashed.arrived);
    }
    if (comm) ncclCommDestroy(comm);
    if (done) cudaEventDestroy(done);
    if (ready) cudaEventDestroy(ready);
    if (stream) cudaStreamDestroy(stream);
}

NcclMessages::Link* NcclMessages::find(int peer, bool sending) {
    for (auto& link : links_)
        if (link->peer == peer && link->sending == sending) return link.get();
    return nullptr;
}

bool NcclMessages::carries(int peer) const {
    for (const auto& link : links_)
        if (link->peer == peer) return true;
    return false;
}

NcclMessages::Link& NcclMessages::link(int peer, bool sending) {
    Link* found = find(peer, sending);
    if (!found)
        throw Error("internal: an NCCL message with rank " + std::to_string(peer) +
                    ", not a ring neighbour");
    return *found;
}

Request NcclMessages::isend(ConstPtr data, std::size_t count, int peer, int tag,
                            const GroupLabel* group) {
    Link& out = link(peer, true);
    // The envelope first: the receiver then posts its ncclRecv, which the send waits for.
    auto envelope = std::make_unique<Envelope>(
        Envelope{tag, static_cast<int64_t>(count), static_cast<int64_t>(data.dtype)});
    Request announced =
        host_.isend(ConstPtr(envelope->data(), DType::i64), envelope->size(), peer, kTag);
    note_device_collective("send", group);
    TRIDENT_CUDA_CHECK(cudaEventRecord(out.ready, compute_));
    TRIDENT_CUDA_CHECK(cudaStreamWaitEvent(out.stream, out.ready, 0));
    TRIDENT_NCCL_CHECK(ncclSend(data.data, count, nccl_type(data.dtype), 1, out.comm, out.stream));
    // Until the request is waited for, the buffer is recorded in use (stream_uses.h).
    kernels::cuda::SharedEvent sent = kernels::cuda::record_stream_use(
        out.stream, {{data.data, count * kernels::size_of(data.dtype)}});
    return Request(std::make_unique<SendPending>(std::move(envelope), std::move(announced),
                                                 std::move(sent), compute_));
}

void NcclMessages::receive(Link& in, void* data, std::size_t count, DType dtype,
                           cudaEvent_t arrived) {
    TRIDENT_CUDA_CHECK(cudaEventRecord(in.ready, compute_));
    TRIDENT_CUDA_CHECK(cudaStreamWaitEvent(in.stream, in.ready, 0));
    TRIDENT_NCCL_CHECK(ncclRecv(data, count, nccl_type(dtype), 0, in.comm, in.stream));
    TRIDENT_CUDA_CHECK(cudaEventRecord(arrived, in.stream));
}

void NcclMessages::recv(Ptr data, std::size_t count, int peer, int tag, const GroupLabel* group) {
    Link& in = link(peer, false);
    note_device_collective("recv", group);
    const auto check = [&](std::size_t got_count, DType got_type) {
        if (got_count != count || got_type != data.dtype)
            throw Error("internal: a message of " + std::to_string(got_count) + " " +
                        kernels::name_of(got_type) + " elements from rank " + std::to_string(peer) +
                        " received as " + std::to_string(count) + " " +
                        kernels::name_of(data.dtype) + " (tag " + std::to_string(tag) + ")");
    };
    // A message that came before it was asked for: its envelope is taken already.
    if (const auto it = in.stash.find(tag); it != in.stash.end()) {
        const Stashed s = it->second;
        in.stash.erase(it);
        check(s.count, s.dtype);
        TRIDENT_CUDA_CHECK(cudaStreamWaitEvent(compute_, s.arrived, 0));
        TRIDENT_CUDA_CHECK(cudaMemcpyAsync(data.data, s.data, count * kernels::size_of(s.dtype),
                                           cudaMemcpyDeviceToDevice, compute_));
        TRIDENT_CUDA_CHECK(cudaFreeAsync(s.data, compute_));
        cudaEventDestroy(s.arrived);  // released once it has happened
        return;
    }
    // The peer's messages in the order it sent them, up to this one.
    for (;;) {
        Envelope e{};
        host_.recv(Ptr(e.data(), DType::i64), e.size(), peer, kTag);
        const auto got_count = static_cast<std::size_t>(e[1]);
        const auto got_type = static_cast<DType>(e[2]);
        if (e[0] == tag) {
            check(got_count, got_type);
            receive(in, data.data, count, data.dtype, in.done);
            TRIDENT_CUDA_CHECK(cudaStreamWaitEvent(compute_, in.done, 0));
            return;
        }
        Stashed s{nullptr, got_count, got_type, new_event()};
        TRIDENT_CUDA_CHECK(cudaMallocAsync(
            &s.data, std::max<std::size_t>(1, got_count * kernels::size_of(got_type)), in.stream));
        receive(in, s.data, got_count, got_type, s.arrived);
        in.stash.emplace(e[0], s);
    }
}

}  // namespace trident::parallel
