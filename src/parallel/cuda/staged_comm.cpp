// Device buffers over a host communicator through pinned memory (see staged_comm.h).
#include "parallel/cuda/staged_comm.h"

#include <cstring>
#include <utility>

#include "kernels/cuda/cuda_check.h"
#include "parallel/cuda/device_memory.h"
#include "parallel/watchdog.h"

namespace trident::parallel {

using kernels::ConstPtr;
using kernels::Ptr;

StagedComm::Pinned::~Pinned() {
    // Nothing may throw here; a failure (the driver shutting down) leaves the memory to exit.
    if (data_ && cudaStreamSynchronize(stream_) == cudaSuccess) cudaFreeHost(data_);
}

StagedComm::Pinned::Pinned(Pinned&& other) noexcept
    : stream_(other.stream_),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

void* StagedComm::Pinned::reserve(std::size_t bytes) {
    if (bytes > bytes_ || data_ == nullptr) {
        if (data_) {
            TRIDENT_CUDA_CHECK(cudaStreamSynchronize(stream_));  // to_device's copies
            TRIDENT_CUDA_CHECK(cudaFreeHost(data_));
        }
        data_ = nullptr;
        bytes_ = std::max<std::size_t>(bytes, 1);
        TRIDENT_CUDA_CHECK(cudaHostAlloc(&data_, bytes_, cudaHostAllocDefault));
    }
    return data_;
}

StagedComm::StagedComm(std::unique_ptr<Comm> host, cudaStream_t stream)
    : host_(std::move(host)), stream_(stream), staging_(stream) {
    TRIDENT_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
}

StagedComm::~StagedComm() {
    cudaEventDestroy(copied_);  // released once it has happened
}

void StagedComm::to_host(void* host, const void* device, std::size_t bytes) {
    if (bytes)
        TRIDENT_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream_));
    const Blocked blocked(kDeviceWait, nullptr);
    TRIDENT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void StagedComm::to_device(void* device, const void* host, std::size_t bytes) {
    // The next call's copy to the host is queued after this one on the same stream and waited
    // for before the staging memory is touched again; a receive, which writes the staging
    // memory first, waits for `copied_`.
    if (bytes)
        TRIDENT_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream_));
    TRIDENT_CUDA_CHECK(cudaEventRecord(copied_, stream_));
}

void StagedComm::copy(void* out, const void* in, std::size_t bytes) {
    if (out == in || bytes == 0) return;
    if (on_device(out)) {
        TRIDENT_CUDA_CHECK(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice, stream_));
    } else {
        std::memmove(out, in, bytes);
    }
}

// Every call is counted here, host buffers too: the trainer reads this communicator's
// statistics, not the host communicator's.
void StagedComm::all_reduce(Ptr data, std::size_t count, ReduceOp op) {
    if (size() == 1) return;
    Comm::count(CommKind::all_reduce, count, data.dtype);
    if (!on_device(data.data)) return host_->all_reduce(data, count, op);
    const std::size_t bytes = count * kernels::size_of(data.dtype);
    void* host = staging_.reserve(bytes);
    to_host(host, data.data, bytes);
    host_->all_reduce(Ptr(host, data.dtype), count, op);
    to_device(data.data, host, bytes);
}

void StagedComm::reduce_scatter(ConstPtr in, Ptr out, std::size_t count) {
    const std::size_t width = kernels::size_of(out.dtype);
    const std::size_t mine = static_cast<std::size_t>(rank()) * count;
    if (size() == 1) return copy(out.data, in.data, count * width);
    Comm::count(CommKind::reduce_scatter, count * size(), out.dtype);
    if (!on_device(out.data)) return host_->reduce_scatter(in, out, count);
    const Ptr host(staging_.reserve(count * size() * width), out.dtype);
    to_host(host.data, in.data, count * size() * width);
    host_->reduce_scatter(host, host + mine, count);  // in place, at this rank's block
    to_device(out.data, (host + mine).data, count * width);
}

void StagedComm::all_gather(ConstPtr in, Ptr out, std::size_t count) {
    const std::size_t width = kernels::size_of(out.dtype);
    const std::size_t mine = static_cast<std::size_t>(rank()) * count;
    if (size() == 1) return copy(out.data, in.data, count * width);
    Comm::count(CommKind::all_gather, count, out.dtype);
    if (!on_device(out.data)) return host_->all_gather(in, out, count);
    const Ptr host(staging_.reserve(count * size() * width), out.dtype);
    to_host((host + mine).data, in.data, count * width);
    host_->all_gather(host + mine, host, count);  // in place, from this rank's block
    to_device(out.data, host.data, count * size() * width);
}

void StagedComm::broadcast(Ptr data, std::size_t count, int root) {
    if (size() == 1) return host_->broadcast(data, count, root);  // checks the root
    Comm::count(CommKind::broadcast, count, data.dtype);
    if (!on_device(data.data)) return host_->broadcast(data, count, root);
    const std::size_t bytes = count * kernels::size_of(data.dtype);
    void* host = staging_.reserve(bytes);
    to_host(host, data.data, bytes);
    host_->broadcast(Ptr(host, data.dtype), count, root);
    to_device(data.data, host, bytes);
}

void StagedComm::all_to_all(ConstPtr in, Ptr out, std::size_t count) {
    const std::size_t bytes = count * size() * kernels::size_of(out.dtype);
    if (size() == 1) return copy(out.data, in.data, bytes);
    Comm::count(CommKind::all_to_all, count * size(), out.dtype);
    if (!on_device(out.data)) return host_->all_to_all(in, out, count);
    // Input and output side by side in the staging memory (they must not overlap).
    const Ptr host(staging_.reserve(2 * bytes), out.dtype);
    const Ptr received = host + count * size();
    to_host(host.data, in.data, bytes);
    host_->all_to_all(host, received, count);
    to_device(out.data, received.data, bytes);
}

void StagedComm::all_to_all_v(ConstPtr in, const std::vector<std::size_t>& send, Ptr out,
                              const std::vector<std::size_t>& recv) {
    std::size_t sent = 0, received = 0;
    for (const std::size_t c : send) sent += c;
    for (const std::size_t c : recv) received += c;
    const std::size_t width = kernels::size_of(out.dtype);
    if (size() == 1) return copy(out.data, in.data, sent * width);
    Comm::count(CommKind::all_to_all, sent, out.dtype);
    if (!on_device(out.data)) return host_->all_to_all_v(in, send, out, recv);
    // Input and output side by side in the staging memory (they must not overlap).
    const Ptr host(staging_.reserve((sent + received) * width), out.dtype);
    to_host(host.data, in.data, sent * width);
    host_->all_to_all_v(host, send, host + sent, recv);
    to_device(out.data, (host + sent).data, received * width);
}

void StagedComm::send(ConstPtr data, std::size_t count, int peer, int tag) {
    Comm::count(CommKind::send, count, data.dtype);
    if (!on_device(data.data)) return host_->send(data, count, peer, tag);
    const std::size_t bytes = count * kernels::size_of(data.dtype);
    void* host = staging_.reserve(bytes);
    to_host(host, data.data, bytes);
    host_->send(ConstPtr(host, data.dtype), count, peer, tag);
}

void StagedComm::recv(Ptr data, std::size_t count, int peer, int tag) {
    Comm::count(CommKind::recv, count, data.dtype);
    if (!on_device(data.data)) return host_->recv(data, count, peer, tag);
    const std::size_t bytes = count * kernels::size_of(data.dtype);
    void* host = staging_.reserve(bytes);
    // Nothing queued may still read the staging memory: wait for to_device's last copy (not
    // for the compute queued after it).
    {
        const Blocked blocked(kDeviceWait, nullptr);
        TRIDENT_CUDA_CHECK(cudaEventSynchronize(copied_));
    }
    host_->recv(Ptr(host, data.dtype), count, peer, tag);
    to_device(data.data, host, bytes);
}

// A host request on a pinned buffer of its own and, for a collective, the copy of its result
// to the device once it has completed. The buffer goes back to the communicator's spares.
class StagedComm::Pending final : public Request::Pending {
public:
    Pending(StagedComm& owner, Pinned buffer, Request host, void* device = nullptr,
            const void* result = nullptr, std::size_t bytes = 0)
        : owner_(owner),
          buffer_(std::move(buffer)),
          host_(std::move(host)),
          device_(device),
          result_(result),
          bytes_(bytes) {}
    ~Pending() override { owner_.spare_.push_back(std::move(buffer_)); }
    bool test() override {
        if (!host_.test()) return false;
        finish();
        return true;
    }
    void wait() override {
        host_.wait();
        finish();
    }

private:
    void finish() {
        if (device_) owner_.to_device(device_, result_, bytes_);
        device_ = nullptr;
    }

    StagedComm& owner_;
    Pinned buffer_;
    Request host_;
    void* device_;
    const void* result_;
    std::size_t bytes_;
};

StagedComm::Pinned StagedComm::spare() {
    if (spare_.empty()) return Pinned(stream_);
    Pinned buffer = std::move(spare_.back());
    spare_.pop_back();
    return buffer;
}

Request StagedComm::isend(ConstPtr data, std::size_t count, int peer, int tag) {
    Comm::count(CommKind::send, count, data.dtype);
    if (!on_device(data.data)) return host_->isend(data, count, peer, tag);
    const std::size_t bytes = count * kernels::size_of(data.dtype);
    Pinned buffer = spare();
    void* host = buffer.reserve(bytes);
    to_host(host, data.data, bytes);
    Request sent = host_->isend(ConstPtr(host, data.dtype), count, peer, tag);
    return Request(std::make_unique<Pending>(*this, std::move(buffer), std::move(sent)));
}

Request StagedComm::iall_reduce(Ptr data, std::size_t count, ReduceOp op) {
    if (size() == 1) return {};
    Comm::count(CommKind::all_reduce, count, data.dtype);
    if (!on_device(data.data)) return host_->iall_reduce(data, count, op);
    const std::size_t bytes = count * kernels::size_of(data.dtype);
    Pinned buffer = spare();
    const Ptr host(buffer.reserve(bytes), data.dtype);
    to_host(host.data, data.data, bytes);
    Request reduced = host_->iall_reduce(host, count, op);
    return Request(std::make_unique<Pending>(*this, std::move(buffer), std::move(reduced),
                                             data.data, host.data, bytes));
}

Request StagedComm::ireduce_scatter(ConstPtr in, Ptr out, std::size_t count) {
    const std::size_t width = kernels::size_of(out.dtype);
    const std::size_t mine = static_cast<std::size_t>(rank()) * count;
    if (size() == 1) {
        copy(out.data, in.data, count * width);
        return {};
    }
    Comm::count(CommKind::reduce_scatter, count * size(), out.dtype);
    if (!on_device(out.data)) return host_->ireduce_scatter(in, out, count);
    Pinned buffer = spare();
    const Ptr host(buffer.reserve(count * size() * width), out.dtype);
    to_host(host.data, in.data, count * size() * width);
    Request reduced = host_->ireduce_scatter(host, host + mine, count);  // at this rank's block
    return Request(std::make_unique<Pending>(*this, std::move(buffer), std::move(reduced), out.data,
                                             (host + mine).data, count * width));
}

Request StagedComm::iall_gather(ConstPtr in, Ptr out, std::size_t count) {
    const std::size_t width = kernels::size_of(out.dtype);
    const std::size_t mine = static_cast<std::size_t>(rank()) * count;
    if (size() == 1) {
        copy(out.data, in.data, count * width);
        return {};
    }
    Comm::count(CommKind::all_gather, count, out.dtype);
    if (!on_device(out.data)) return host_->iall_gather(in, out, count);
    Pinned buffer = spare();
    const Ptr host(buffer.reserve(count * size() * width), out.dtype);
    to_host((host + mine).data, in.data, count * width);
    Request gathered = host_->iall_gather(host + mine, host, count);  // from this rank's block
    return Request(std::make_unique<Pending>(*this, std::move(buffer), std::move(gathered),
                                             out.data, host.data, count * size() * width));
}

void StagedComm::barrier() {
    host_->barrier();
}

}  // namespace trident::parallel
