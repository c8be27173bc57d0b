// The group of one process: what a model or optimizer talks to when it is not split, so the
// same code runs with and without MPI (single-process tools and unit tests).
#pragma once

#include "parallel/comm.h"

namespace trident::parallel {

class SoloComm final : public Comm {
public:
    int rank() const override { return 0; }
    int size() const override { return 1; }
    void all_reduce(float*, std::size_t, ReduceOp) override {}
    void reduce_scatter(const float* in, float* out, std::size_t count) override;
    void all_gather(const float* in, float* out, std::size_t count) override;
    void broadcast(float*, std::size_t, int) override {}
    void send(const float*, std::size_t, int, int) override;
    void recv(float*, std::size_t, int, int) override;
    void barrier() override {}
    void send_async(const float*, std::size_t, int, int) override;
    void wait_sends() override {}
};

}  // namespace trident::parallel
