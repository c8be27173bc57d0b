// The group of one process: what a model or optimizer talks to when it is not split, so the
// same code runs with and without MPI (single-process tools and unit tests).
#pragma once

#include "parallel/comm.h"

namespace trident::parallel {

class SoloComm final : public Comm {
public:
    int rank() const override { return 0; }
    int size() const override { return 1; }
    void all_reduce(kernels::Ptr, std::size_t, ReduceOp) override {}
    // Host buffers only, where in and out differ (a model or optimizer passes them in place).
    void reduce_scatter(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) override;
    void all_gather(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) override;
    void all_to_all(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) override;
    void all_to_all_v(kernels::ConstPtr in, const std::vector<std::size_t>& send, kernels::Ptr out,
                      const std::vector<std::size_t>& recv) override;
    void broadcast(kernels::Ptr, std::size_t, int) override {}
    void send(kernels::ConstPtr, std::size_t, int, int) override;
    void recv(kernels::Ptr, std::size_t, int, int) override;
    void barrier() override {}
    Request isend(kernels::ConstPtr, std::size_t, int, int) override;
    Request iall_reduce(kernels::Ptr, std::size_t, ReduceOp) override { return {}; }
    // Done at once: a copy, if any.
    Request ireduce_scatter(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) override {
        reduce_scatter(in, out, count);
        return {};
    }
    Request iall_gather(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) override {
        all_gather(in, out, count);
        return {};
    }
};

}  // namespace trident::parallel
