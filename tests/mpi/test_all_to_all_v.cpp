// Comm::all_to_all_v (expert parallelism's dispatch, docs/ARCHITECTURE.md "Comm") on the world:
// uneven and empty blocks arrive from every rank in rank order, in fp32 and i32, and count as
// all-to-all traffic; its non-blocking form (iall_to_all_v) moves the same while the caller
// goes on.
#include <mpi.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "parallel/mpi_comm.h"
#include "parallel/solo_comm.h"

using namespace trident::parallel;

namespace {

// The elements rank `from` sends rank `to`: 0 for some pairs, up to 3.
std::size_t block(int from, int to) {
    return static_cast<std::size_t>((from + 2 * to) % 4);
}

// What element i of that block holds.
int32_t value(int from, int to, std::size_t i) {
    return 1000 * from + 10 * to + static_cast<int32_t>(i);
}

// This rank's blocks for every rank and the blocks it should receive, with their counts.
struct Blocks {
    std::vector<std::size_t> send, recv;
    std::vector<int32_t> ints, want;
};

Blocks blocks(int n, int r) {
    Blocks b;
    for (int q = 0; q < n; ++q) {
        b.send.push_back(block(r, q));
        b.recv.push_back(block(q, r));
        for (std::size_t i = 0; i < block(r, q); ++i) b.ints.push_back(value(r, q, i));
        for (std::size_t i = 0; i < block(q, r); ++i) b.want.push_back(value(q, r, i));
    }
    return b;
}

}  // namespace

TEST_CASE("comm: all_to_all_v moves uneven blocks from every rank in rank order", "[mpi][comm]") {
    MpiComm comm(MPI_COMM_WORLD);
    const int n = comm.size();
    const auto [send, recv, ints, want] = blocks(n, comm.rank());
    std::vector<int32_t> got(want.size() + 1, -1);
    comm.reset_stats();
    comm.all_to_all_v(ints.data(), send, got.data(), recv);
    got.pop_back();
    CHECK(got == want);
    if (n > 1) CHECK(comm.stats().elements_of(CommKind::all_to_all) == ints.size());
    const std::vector<float> floats(ints.begin(), ints.end());
    std::vector<float> got_floats(want.size());
    comm.all_to_all_v(floats.data(), send, got_floats.data(), recv);
    CHECK(got_floats == std::vector<float>(want.begin(), want.end()));
}

TEST_CASE("comm: iall_to_all_v moves the same blocks while the caller goes on", "[mpi][comm]") {
    MpiComm comm(MPI_COMM_WORLD);
    const int n = comm.size();
    const auto [send, recv, ints, want] = blocks(n, comm.rank());
    std::vector<int32_t> got(want.size(), -1);
    comm.reset_stats();
    Request moving = comm.iall_to_all_v(ints.data(), send, got.data(), recv);
    // Another collective on the same group in between: the worker's duplicate keeps them apart.
    int ranks = 1;
    comm.all_reduce(&ranks, 1);
    moving.wait();
    CHECK(ranks == n);
    CHECK(got == want);
    if (n > 1) CHECK(comm.stats().elements_of(CommKind::all_to_all) == ints.size());
}

TEST_CASE("comm: all_to_all_v in a group of one is a copy", "[comm]") {
    SoloComm solo;
    const std::vector<float> in = {1, 2, 3};
    std::vector<float> out(3);
    solo.all_to_all_v(in.data(), {3}, out.data(), {3});
    CHECK(out == in);
    std::vector<float> later(3);
    solo.iall_to_all_v(in.data(), {3}, later.data(), {3}).wait();
    CHECK(later == in);
}
