// StagedComm: a Comm for device buffers over a host communicator (MpiComm), copying each
// buffer to pinned host memory, calling the host communicator, and copying the result back.
//
// Used when NCCL cannot be: ranks that share a GPU (NCCL refuses two ranks of a communicator
// on one device), which gpu_binding detects. It is slower than NCCL (two PCIe copies and a
// synchronisation per call) but exact and deterministic, the MPI algorithms summing as they
// do for host buffers. NcclComm also uses it for point-to-point messages other than between
// ring neighbours (see nccl_comm.h). Host buffers go straight to the host communicator.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "parallel/comm.h"

namespace trident::parallel {

class StagedComm final : public Comm {
public:
    // `stream`: the compute stream whose work on the device buffers comes before each call.
    StagedComm(std::unique_ptr<Comm> host, cudaStream_t stream);
    ~StagedComm() override;
    StagedComm(const StagedComm&) = delete;
    StagedComm& operator=(const StagedComm&) = delete;

    int rank() const override { return host_->rank(); }
    int size() const override { return host_->size(); }

    void all_reduce(kernels::Ptr data, std::size_t count, ReduceOp op = ReduceOp::sum) override;
    void reduce_scatter(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) override;
    void all_gather(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) override;
    void broadcast(kernels::Ptr data, std::size_t count, int root) override;
    void all_to_all(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) override;
    void all_to_all_v(kernels::ConstPtr in, const std::vector<std::size_t>& send, kernels::Ptr out,
                      const std::vector<std::size_t>& recv) override;
    void send(kernels::ConstPtr data, std::size_t count, int peer, int tag) override;
    void recv(kernels::Ptr data, std::size_t count, int peer, int tag) override;
    void barrier() override;
    // Each keeps a pinned buffer of its own until it completes; the result of a collective
    // is copied to the device (queued on the stream) when the host call has completed. Every
    // request must complete before the communicator goes.
    Request isend(kernels::ConstPtr data, std::size_t count, int peer, int tag) override;
    Request iall_reduce(kernels::Ptr data, std::size_t count, ReduceOp op = ReduceOp::sum) override;
    Request ireduce_scatter(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) override;
    Request iall_gather(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) override;

private:
    // Page-locked host memory (cudaHostAlloc), so copies run at full speed. A copy to the
    // device queued on `stream` may still read it when the call that queued it returns, so it
    // is freed (grown, destroyed) only once that stream's work is done.
    class Pinned {
    public:
        explicit Pinned(cudaStream_t stream) : stream_(stream) {}
        ~Pinned();
        Pinned(Pinned&& other) noexcept;
        Pinned& operator=(Pinned&&) = delete;
        void* reserve(std::size_t bytes);  // at least `bytes`, contents not kept
    private:
        cudaStream_t stream_;
        void* data_ = nullptr;
        std::size_t bytes_ = 0;
    };

    class Pending;

    void to_host(void* host, const void* device, std::size_t bytes);    // waits for the copy
    void to_device(void* device, const void* host, std::size_t bytes);  // queued
    void copy(void* out, const void* in, std::size_t bytes);  // a group of one's "collective"
    Pinned spare();  // a pinned buffer for a request, from those earlier ones gave back

    std::unique_ptr<Comm> host_;
    cudaStream_t stream_;
    Pinned staging_;
    std::vector<Pinned> spare_;     // given back by completed requests
    cudaEvent_t copied_ = nullptr;  // after to_device's last copy
};

}  // namespace trident::parallel
