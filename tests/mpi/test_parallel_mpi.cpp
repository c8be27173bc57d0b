// Multi-rank tests of the parallel runtime, run under mpirun with 1, 2, 4 and 8 ranks: the
// world, the groups of every grid that factorises the world size, every Comm call's result
// and traffic counters (fp32 and 16-bit), bitwise-identical all-reduces, errors thrown on
// every rank, and fp16 overflow decisions that a whole grid takes together.
//
// Every rank runs every test case in the same order, so the collectives inside them match.
// Checks use CHECK, never REQUIRE, after a test's first collective: a rank that left a test
// early would leave its peers waiting. The exit code is non-zero when any rank failed.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "config/config.h"
#include "kernels/dtype.h"
#include "kernels/error.h"
#include "kernels/ops.h"
#include "kernels/random.h"
#include "parallel/grid.h"
#include "parallel/mpi_comm.h"
#include "parallel/world.h"
#include "train/trainer.h"

using namespace trident::parallel;

namespace {

World* the_world = nullptr;
World& world() {
    return *the_world;
}

// Every (P, M, D) with P*M*D == n.
std::vector<GridShape> factorisations(int n) {
    std::vector<GridShape> shapes;
    for (int p = 1; p <= n; ++p)
        for (int m = 1; p * m <= n; ++m)
            if (n % (p * m) == 0) shapes.push_back({p, m, n / (p * m)});
    return shapes;
}

// A value rank r puts at index i: small integers, so every sum is exact in float and the
// expected result does not depend on the order of the additions. Not monotone in r, so max
// is not simply the last rank's value.
float value(int r, std::size_t i) {
    const long long k = static_cast<long long>(i);
    return static_cast<float>((r * 7 + k * 3) % 11 + r - 5);
}

std::vector<float> values_of(int r, std::size_t count) {
    std::vector<float> v(count);
    for (std::size_t i = 0; i < count; ++i) v[i] = value(r, i);
    return v;
}

// One Comm's collectives on `count` elements each, their results and counters.
void check_collectives(Comm& comm, std::size_t count) {
    const int n = comm.size(), r = comm.rank();
    const uint64_t counted = n > 1 ? 1 : 0;  // a group of one counts nothing
    INFO("group of " << n << ", rank " << r << ", count " << count);
    comm.reset_stats();

    std::vector<float> sum = values_of(r, count), expected_sum(count, 0.0f);
    std::vector<float> max = values_of(r, count), expected_max = values_of(0, count);
    for (int q = 0; q < n; ++q)
        for (std::size_t i = 0; i < count; ++i) {
            expected_sum[i] += value(q, i);
            expected_max[i] = std::max(expected_max[i], value(q, i));
        }
    comm.all_reduce(sum.data(), count);
    comm.all_reduce(max.data(), count, ReduceOp::max);
    CHECK(sum == expected_sum);
    CHECK(max == expected_max);

    // reduce_scatter: rank q hands in values_of(q, n*count); rank r keeps the sum of block r.
    const std::vector<float> full = values_of(r, n * count);
    std::vector<float> block(count, -99.0f), expected_block(count, 0.0f);
    for (int q = 0; q < n; ++q)
        for (std::size_t i = 0; i < count; ++i) expected_block[i] += value(q, r * count + i);
    comm.reduce_scatter(full.data(), block.data(), count);
    CHECK(block == expected_block);

    std::vector<float> gathered(n * count, -99.0f), expected_gathered;
    for (int q = 0; q < n; ++q)
        for (std::size_t i = 0; i < count; ++i) expected_gathered.push_back(value(q, i));
    const std::vector<float> mine = values_of(r, count);
    comm.all_gather(mine.data(), gathered.data(), count);
    CHECK(gathered == expected_gathered);

    for (int root = 0; root < n; ++root) {
        std::vector<float> data = values_of(r, count);
        comm.broadcast(data.data(), count, root);
        CHECK(data == values_of(root, count));
    }

    const CommStats& s = comm.stats();
    CHECK(s.calls_of(CommKind::all_reduce) == 2 * counted);
    CHECK(s.elements_of(CommKind::all_reduce) == 2 * count * counted);
    CHECK(s.bytes_of(CommKind::all_reduce) == 8 * count * counted);
    CHECK(s.calls_of(CommKind::reduce_scatter) == counted);
    CHECK(s.elements_of(CommKind::reduce_scatter) == n * count * counted);
    CHECK(s.calls_of(CommKind::all_gather) == counted);
    CHECK(s.elements_of(CommKind::all_gather) == count * counted);
    CHECK(s.calls_of(CommKind::broadcast) == n * counted);
    CHECK(s.elements_of(CommKind::broadcast) == n * count * counted);
    CHECK(s.calls_of(CommKind::send) == 0);
    CHECK(s.calls_of(CommKind::recv) == 0);
}

// Activations forward along the group (r -> r+1), gradients back (r -> r-1), as a pipeline
// sends them; each message checked, and the counters.
void check_send_recv(Comm& comm, std::size_t count) {
    const int n = comm.size(), r = comm.rank();
    INFO("group of " << n << ", rank " << r << ", count " << count);
    comm.reset_stats();
    std::vector<float> received(count, -99.0f);
    if (r > 0) {
        comm.recv(received.data(), count, r - 1, 1);
        CHECK(received == values_of(r - 1, count));
    }
    if (r < n - 1) comm.send(values_of(r, count).data(), count, r + 1, 1);
    if (r < n - 1) {
        comm.recv(received.data(), count, r + 1, 2);
        CHECK(received == values_of(100 + r + 1, count));
    }
    if (r > 0) comm.send(values_of(100 + r, count).data(), count, r - 1, 2);

    const uint64_t neighbours = (r > 0 ? 1 : 0) + (r < n - 1 ? 1 : 0);
    CHECK(comm.stats().calls_of(CommKind::send) == neighbours);
    CHECK(comm.stats().elements_of(CommKind::send) == neighbours * count);
    CHECK(comm.stats().calls_of(CommKind::recv) == neighbours);
    CHECK(comm.stats().elements_of(CommKind::recv) == neighbours * count);
    CHECK(comm.stats().calls_of(CommKind::all_reduce) == 0);
}

// The in-place forms ZeRO-1 uses: reduce-scatter into this rank's own block of the input,
// all-gather from it.
void check_in_place(Comm& comm, std::size_t count) {
    const int n = comm.size(), r = comm.rank();
    INFO("group of " << n << ", rank " << r << ", count " << count);
    std::vector<float> buffer = values_of(r, n * count);
    const std::vector<float> before = buffer;
    std::vector<float> expected(count, 0.0f);
    for (int q = 0; q < n; ++q)
        for (std::size_t i = 0; i < count; ++i) expected[i] += value(q, r * count + i);
    float* own = buffer.data() + r * count;
    comm.reduce_scatter(buffer.data(), own, count);
    CHECK(std::vector<float>(own, own + count) == expected);
    for (int q = 0; q < n; ++q) {  // the other blocks of the input are left as they were
        if (q == r) continue;
        const auto* b = buffer.data() + q * count;
        CHECK(std::vector<float>(b, b + count) ==
              std::vector<float>(before.begin() + q * count, before.begin() + (q + 1) * count));
    }

    std::vector<float> gathered(n * count, -99.0f);
    const std::vector<float> mine = values_of(r, count);
    std::copy(mine.begin(), mine.end(), gathered.begin() + r * count);
    comm.all_gather(gathered.data() + r * count, gathered.data(), count);
    std::vector<float> expected_gathered;
    for (int q = 0; q < n; ++q)
        for (std::size_t i = 0; i < count; ++i) expected_gathered.push_back(value(q, i));
    CHECK(gathered == expected_gathered);
}

// The world ranks of a group, in group-rank order, as the group itself reports them.
std::vector<float> members_of(Comm& group) {
    const float me = static_cast<float>(world().rank());
    std::vector<float> members(group.size());
    group.all_gather(&me, members.data(), 1);
    return members;
}

// Random floats of mixed sign and magnitude, so the order of additions changes the bits.
std::vector<float> random_values(int rank, std::size_t count) {
    std::mt19937 engine(1234 + 7919 * rank + static_cast<unsigned>(count));
    std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
    std::uniform_int_distribution<int> exponent(-20, 20);
    std::vector<float> v(count);
    for (float& x : v) x = std::ldexp(mantissa(engine), exponent(engine));
    return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A second MpiComm over the whole world, splitting every call into pieces of 3 elements.
std::unique_ptr<MpiComm> world_in_pieces() {
    MPI_Comm copy;
    MPI_Comm_dup(MPI_COMM_WORLD, &copy);
    return std::make_unique<MpiComm>(copy, 3);
}

}  // namespace

TEST_CASE("world: rank, size and local rank", "[mpi]") {
    int rank = -1, size = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    CHECK(world().rank() == rank);
    CHECK(world().size() == size);
    CHECK(world().comm().rank() == rank);
    CHECK(world().comm().size() == size);
    CHECK(world().local_rank() >= 0);
    CHECK(world().local_rank() < world().local_size());
    CHECK(world().local_size() <= world().size());
    // Local ranks on one node are 0..local_size-1, each once; mpirun here starts one node.
    std::vector<float> locals(size);
    const float mine = static_cast<float>(world().local_rank());
    world().comm().all_gather(&mine, locals.data(), 1);
    if (world().local_size() == size)
        for (int r = 0; r < size; ++r) CHECK(locals[r] == static_cast<float>(r));
}

TEST_CASE("grid: every factorisation of the world size has the groups of the grid order",
          "[mpi][grid]") {
    const int rank = world().rank();
    for (const GridShape& shape : factorisations(world().size())) {
        const int P = shape.pipeline, M = shape.tensor, D = shape.data;
        INFO("grid P " << P << " x M " << M << " x D " << D << ", world rank " << rank);
        Grid grid(world(), shape);
        const Coordinates c = grid.coordinates();
        const Coordinates expected = coordinates_of(shape, rank);
        CHECK(grid.rank() == rank);
        CHECK(c.pp == expected.pp);
        CHECK(c.dp == expected.dp);
        CHECK(c.tp == expected.tp);
        CHECK(grid.first_stage() == (c.pp == 0));
        CHECK(grid.last_stage() == (c.pp == P - 1));

        // Each group's members in group-rank order, and this rank's place among them.
        std::vector<float> tensor, data, pipeline, embedding;
        for (int t = 0; t < M; ++t) tensor.push_back(rank_of(shape, {c.pp, c.dp, t}));
        for (int d = 0; d < D; ++d) data.push_back(rank_of(shape, {c.pp, d, c.tp}));
        for (int p = 0; p < P; ++p) pipeline.push_back(rank_of(shape, {p, c.dp, c.tp}));
        int embedding_rank = 0;
        if (P == 1 || !grid.in_embedding_group()) {
            embedding = {static_cast<float>(rank)};
        } else {
            embedding = {static_cast<float>(rank_of(shape, {0, c.dp, c.tp})),
                         static_cast<float>(rank_of(shape, {P - 1, c.dp, c.tp}))};
            embedding_rank = grid.last_stage() ? 1 : 0;
        }
        CHECK(grid.in_embedding_group() == (c.pp == 0 || c.pp == P - 1));

        CHECK(grid.tensor().size() == M);
        CHECK(grid.tensor().rank() == c.tp);
        CHECK(members_of(grid.tensor()) == tensor);
        CHECK(grid.data().size() == D);
        CHECK(grid.data().rank() == c.dp);
        CHECK(members_of(grid.data()) == data);
        CHECK(grid.pipeline().size() == P);
        CHECK(grid.pipeline().rank() == c.pp);
        CHECK(members_of(grid.pipeline()) == pipeline);
        CHECK(grid.embedding().size() == static_cast<int>(embedding.size()));
        CHECK(grid.embedding().rank() == embedding_rank);
        CHECK(members_of(grid.embedding()) == embedding);
    }
}

TEST_CASE("grid: every named group's communicator holds group_ranks' members, experts too",
          "[mpi][grid]") {
    const int rank = world().rank(), n = world().size();
    std::vector<GridShape> shapes = factorisations(n);
    if (n % 2 == 0) {  // the experts split over pairs, and over all n ranks
        GridShape experts{1, 1, n, 1};
        experts.expert = 2;
        shapes.push_back(experts);
        experts.expert = n;
        shapes.push_back(experts);
    }
    if (n % 4 == 0) {  // hybrid sharding over fours, the experts split over pairs within them
        GridShape hybrid{1, 1, n, 1};
        hybrid.data_shard = 4;
        hybrid.expert = 2;
        shapes.push_back(hybrid);
    }
    for (const GridShape& shape : shapes) {
        INFO("grid P " << shape.pipeline << " x M " << shape.tensor << " x D " << shape.data
                       << ", E " << shape.expert << ", N " << shape.data_shard << ", world rank "
                       << rank);
        Grid grid(world(), shape);
        for (int k = 0; k < kGroups; ++k) {
            const Group g = static_cast<Group>(k);
            INFO(group_name(g));
            std::vector<float> want;
            for (int r : group_ranks(shape, g, rank)) want.push_back(static_cast<float>(r));
            CHECK(members_of(grid.group(g)) == want);
        }
    }
}

TEST_CASE("comm: every call on every group of every grid", "[mpi][comm]") {
    for (const GridShape& shape : factorisations(world().size())) {
        INFO("grid P " << shape.pipeline << " x M " << shape.tensor << " x D " << shape.data);
        Grid grid(world(), shape);
        for (Comm* group : {&grid.tensor(), &grid.data(), &grid.pipeline(), &grid.embedding()})
            check_collectives(*group, 5);
        check_send_recv(grid.pipeline(), 5);
        check_in_place(grid.data(), 5);
    }
}

TEST_CASE("comm: the world's calls on empty, small and large buffers", "[mpi][comm]") {
    for (std::size_t count : {0, 1, 1000, 100003}) {
        check_collectives(world().comm(), count);
        check_in_place(world().comm(), count);
    }
    if (world().size() > 1)
        for (std::size_t count : {0, 1, 100003}) check_send_recv(world().comm(), count);
    world().comm().barrier();
}

TEST_CASE("comm: calls larger than an MPI call's limit go in pieces", "[mpi][comm]") {
    auto pieces = world_in_pieces();
    for (std::size_t count : {0, 2, 3, 10}) {
        check_collectives(*pieces, count);
        check_in_place(*pieces, count);
        if (world().size() > 1) check_send_recv(*pieces, count);
    }
}

TEST_CASE("comm: other overlaps of input and output still give the right result", "[mpi][comm]") {
    Comm& comm = world().comm();
    const int n = comm.size(), r = comm.rank();
    const std::size_t count = 4;
    // reduce_scatter into the start of the input (rank 0's block, whatever this rank is).
    std::vector<float> buffer = values_of(r, n * count), expected(count, 0.0f);
    for (int q = 0; q < n; ++q)
        for (std::size_t i = 0; i < count; ++i) expected[i] += value(q, r * count + i);
    comm.reduce_scatter(buffer.data(), buffer.data(), count);
    CHECK(std::vector<float>(buffer.begin(), buffer.begin() + count) == expected);
    // all_gather from the start of the output.
    std::vector<float> gathered(n * count, -99.0f), expected_gathered;
    const std::vector<float> mine = values_of(r, count);
    std::copy(mine.begin(), mine.end(), gathered.begin());
    comm.all_gather(gathered.data(), gathered.data(), count);
    for (int q = 0; q < n; ++q)
        for (std::size_t i = 0; i < count; ++i) expected_gathered.push_back(value(q, i));
    CHECK(gathered == expected_gathered);
}

TEST_CASE("comm: all_reduce gives the same bits on every rank and every run", "[mpi][comm]") {
    Comm& comm = world().comm();
    const int n = comm.size(), r = comm.rank();
    // Sizes on both sides of Open MPI's switches between algorithms.
    for (std::size_t count : {1, 7, 1000, 32771, 1 << 20}) {
        INFO("count " << count << ", rank " << r);
        const std::vector<float> inputs = random_values(r, count);
        std::vector<float> first = inputs, second = inputs;
        comm.all_reduce(first.data(), count);
        comm.all_reduce(second.data(), count);
        CHECK(same_bits(first, second));  // every run
        std::vector<float> rank0 = first;
        comm.broadcast(rank0.data(), count, 0);
        CHECK(same_bits(first, rank0));  // every rank

        std::vector<float> maxima = inputs;
        comm.all_reduce(maxima.data(), count, ReduceOp::max);
        std::vector<float> rank0_maxima = maxima;
        comm.broadcast(rank0_maxima.data(), count, 0);
        CHECK(same_bits(maxima, rank0_maxima));

        // Against sums and maxima in double of every rank's inputs, made again here.
        if (count > 32771) continue;
        std::vector<double> exact(count, 0.0), magnitude(count, 0.0);
        std::vector<float> exact_max(count, -INFINITY);
        for (int q = 0; q < n; ++q) {
            const std::vector<float> theirs = random_values(q, count);
            for (std::size_t i = 0; i < count; ++i) {
                exact[i] += theirs[i];
                magnitude[i] += std::fabs(theirs[i]);
                exact_max[i] = std::max(exact_max[i], theirs[i]);
            }
        }
        int wrong_sums = 0;
        for (std::size_t i = 0; i < count; ++i)
            if (std::fabs(first[i] - exact[i]) > 1e-6 * magnitude[i]) ++wrong_sums;
        CHECK(wrong_sums == 0);
        CHECK(same_bits(maxima, exact_max));
    }
}

// The non-blocking calls, all started before any is waited for (as ZeRO's prefetches and the
// gradients' buckets are), against the blocking calls on the same inputs, bit for bit.
void check_non_blocking(Comm& comm, std::size_t count) {
    const int n = comm.size(), r = comm.rank();
    INFO("group of " << n << ", rank " << r << ", count " << count);
    const std::vector<float> mine = random_values(r, count), full = random_values(r, n * count);
    std::vector<float> sum = mine, block(count), gathered(n * count), own_block(n * count);
    comm.all_reduce(sum.data(), count);
    comm.reduce_scatter(full.data(), block.data(), count);
    comm.all_gather(mine.data(), gathered.data(), count);

    std::vector<float> i_sum = mine, i_block(count, -99.0f), i_gathered(n * count, -99.0f);
    std::vector<float> from_left(count, -99.0f);
    std::copy(mine.begin(), mine.end(), own_block.begin() + r * count);
    std::vector<Request> started;
    started.push_back(comm.iall_reduce(i_sum.data(), count));
    started.push_back(comm.ireduce_scatter(full.data(), i_block.data(), count));
    started.push_back(comm.iall_gather(mine.data(), i_gathered.data(), count));
    started.push_back(comm.iall_gather(own_block.data() + r * count, own_block.data(), count));
    if (n > 1)  // a ring: to the right, from the left
        started.push_back(
            comm.isendrecv(mine.data(), from_left.data(), count, (r + 1) % n, (r + n - 1) % n, 3));
    for (Request& request : started) request.wait();
    CHECK(same_bits(i_sum, sum));
    CHECK(same_bits(i_block, block));
    CHECK(same_bits(i_gathered, gathered));
    CHECK(same_bits(own_block, gathered));
    if (n > 1) CHECK(same_bits(from_left, random_values((r + n - 1) % n, count)));
}

TEST_CASE("comm: the non-blocking calls give the blocking calls' bits", "[mpi][comm]") {
    for (std::size_t count : {0, 1, 1000, 100003}) check_non_blocking(world().comm(), count);
    auto pieces = world_in_pieces();
    for (std::size_t count : {0, 2, 3, 10}) check_non_blocking(*pieces, count);
    for (const GridShape& shape : factorisations(world().size())) {
        Grid grid(world(), shape);
        for (Comm* group : {&grid.tensor(), &grid.data(), &grid.pipeline()})
            check_non_blocking(*group, 1000);
    }
}

TEST_CASE("comm: bad arguments throw on the calling rank before any communication", "[mpi][comm]") {
    Comm& comm = world().comm();
    const int n = comm.size(), r = comm.rank();
    float x[2] = {1.0f, 2.0f};
    comm.reset_stats();
    CHECK_THROWS_AS(comm.send(x, 2, r, 0), trident::Error);  // to itself
    CHECK_THROWS_AS(comm.send(x, 2, -1, 0), trident::Error);
    CHECK_THROWS_AS(comm.recv(x, 2, n, 0), trident::Error);
    CHECK_THROWS_AS(comm.send(x, 2, (r + 1) % n, -1), trident::Error);
    CHECK_THROWS_WITH(comm.broadcast(x, 2, n), "parallel: broadcast from root " +
                                                   std::to_string(n) + " in a group of " +
                                                   std::to_string(n));
    CHECK(comm.stats().calls_of(CommKind::send) == 0);
    comm.barrier();  // and no rank is left behind
}

TEST_CASE("grid: P*M*C*D other than the world size throws on every rank", "[mpi][grid]") {
    const int n = world().size();
    const std::string started = std::to_string(n) + (n == 1 ? " process was" : " processes were");
    CHECK_THROWS_WITH(Grid(world(), GridShape{1, 1, n + 1}),
                      "parallel: pipeline × tensor × context × data = 1 × 1 × 1 × " +
                          std::to_string(n + 1) + " = " + std::to_string(n + 1) + ", but " +
                          started + " started (mpirun -np " + std::to_string(n + 1) + ")");
    CHECK_THROWS_WITH(Grid(world(), GridShape{2, 2, 2 * n}),
                      "parallel: pipeline × tensor × context × data = 2 × 2 × 1 × " +
                          std::to_string(2 * n) + " = " + std::to_string(8 * n) + ", but " +
                          started + " started (mpirun -np " + std::to_string(8 * n) + ")");
    CHECK_THROWS_WITH(Grid(world(), GridShape{1, 2, n, 2}),  // {P, M, D, C}
                      "parallel: pipeline × tensor × context × data = 1 × 2 × 2 × " +
                          std::to_string(n) + " = " + std::to_string(4 * n) + ", but " + started +
                          " started (mpirun -np " + std::to_string(4 * n) + ")");
    CHECK_THROWS_WITH(Grid(world(), GridShape{0, 1, n}),
                      Catch::Contains("each must be at least 1"));
    // Every rank threw before communicating, so all arrive here.
    world().comm().barrier();
    Grid whole(world(), GridShape{1, 1, n});  // and the world is still usable
    CHECK(whole.data().size() == n);
}

TEST_CASE("comm: bf16 and fp16 sums add in fp32 and round, the same bits on every rank",
          "[mpi][comm]") {
    using trident::kernels::DType;
    using trident::kernels::Ptr;
    Comm& comm = world().comm();
    const int n = comm.size(), r = comm.rank();
    const std::size_t count = 6;
    for (DType t : {DType::bf16, DType::f16}) {
        INFO("type " << trident::kernels::name_of(t));
        // Small integers are exact in both types: every sum must be exact.
        std::vector<float> mine(count * n);
        for (std::size_t i = 0; i < mine.size(); ++i)
            mine[i] = static_cast<float>((r + 1) * (i % 5));
        std::vector<uint16_t> buffer(mine.size());
        trident::kernels::narrow(Ptr(buffer.data(), t), mine.data(), mine.size());
        comm.reset_stats();
        comm.all_reduce(Ptr(buffer.data(), t), buffer.size());
        std::vector<float> sum(buffer.size());
        trident::kernels::widen(sum.data(), Ptr(buffer.data(), t), sum.size());
        for (std::size_t i = 0; i < sum.size(); ++i)
            CHECK(sum[i] == static_cast<float>(n * (n + 1) / 2 * (i % 5)));
        if (n > 1) CHECK(comm.stats().bytes_of(CommKind::all_reduce) == 2 * buffer.size());

        // Values that round: every rank must still get the same bits, close to the true sum.
        std::vector<float> noisy(count);
        for (std::size_t i = 0; i < count; ++i)
            noisy[i] = 1.0f + 0.001f * static_cast<float>(r * 7 + i);
        std::vector<uint16_t> h(count);
        trident::kernels::narrow(Ptr(h.data(), t), noisy.data(), count);
        comm.all_reduce(Ptr(h.data(), t), count);
        std::vector<uint16_t> gathered(count * n);
        comm.all_gather(Ptr(h.data(), DType::u16), Ptr(gathered.data(), DType::u16), count);
        for (int q = 0; q < n; ++q)
            for (std::size_t i = 0; i < count; ++i) CHECK(gathered[q * count + i] == h[i]);

        // reduce_scatter and max.
        std::vector<uint16_t> blocks(count * n), out(count);
        trident::kernels::narrow(Ptr(blocks.data(), t), mine.data(), mine.size());
        comm.reduce_scatter(Ptr(blocks.data(), t), Ptr(out.data(), t), count);
        std::vector<float> scattered(count);
        trident::kernels::widen(scattered.data(), Ptr(out.data(), t), count);
        for (std::size_t i = 0; i < count; ++i)
            CHECK(scattered[i] == static_cast<float>(n * (n + 1) / 2 * ((r * count + i) % 5)));
        std::vector<uint16_t> top(1);
        const float me = static_cast<float>(r);
        trident::kernels::narrow(Ptr(top.data(), t), &me, 1);
        comm.all_reduce(Ptr(top.data(), t), 1, ReduceOp::max);
        float biggest = 0;
        trident::kernels::widen(&biggest, Ptr(top.data(), t), 1);
        CHECK(biggest == static_cast<float>(n - 1));
    }
}

TEST_CASE("comm: doubles, integers and bytes travel as what they are, exactly", "[mpi][comm]") {
    using trident::kernels::DType;
    using trident::kernels::Ptr;
    Comm& comm = world().comm();
    const int n = comm.size(), r = comm.rank();
    const uint64_t counted = n > 1 ? 1 : 0;
    comm.reset_stats();

    // A double's low bits survive a sum: 1 + r * 2^-40 is not a float.
    double norm = 1.0 + std::ldexp(static_cast<double>(r), -40);
    comm.all_reduce(&norm, 1);
    CHECK(norm == static_cast<double>(n) + std::ldexp(n * (n - 1) / 2.0, -40));
    double loss = r == n - 1 ? 1.0 / 3.0 : 0.0;
    comm.broadcast(&loss, 1, n - 1);
    CHECK(loss == 1.0 / 3.0);

    // 64-bit integers past 2^53 (not exact in a double), summed and maximised.
    int64_t sizes[2] = {(int64_t{1} << 55) + r, (int64_t{1} << 60) + 3 * r};
    comm.all_reduce(sizes, 2, ReduceOp::max);
    CHECK(sizes[0] == (int64_t{1} << 55) + n - 1);
    CHECK(sizes[1] == (int64_t{1} << 60) + 3 * (n - 1));
    int64_t total = (int64_t{1} << 55) + r;
    comm.all_reduce(&total, 1);
    CHECK(total == n * (int64_t{1} << 55) + n * (n - 1) / 2);
    int32_t flag = r == n / 2 ? 7 : 0;
    comm.all_reduce(&flag, 1, ReduceOp::max);
    CHECK(flag == 7);
    uint64_t bits = uint64_t{1} << (63 - r);
    comm.all_reduce(&bits, 1);
    CHECK(bits == (~uint64_t{0} << (64 - n)));

    // Bytes: every value 0..255, gathered and broadcast unchanged.
    std::vector<uint8_t> digest(256), digests(256 * n);
    for (std::size_t i = 0; i < digest.size(); ++i) digest[i] = static_cast<uint8_t>(i + r);
    comm.all_gather(digest.data(), digests.data(), digest.size());
    int wrong = 0;
    for (int q = 0; q < n; ++q)
        for (std::size_t i = 0; i < 256; ++i)
            wrong += digests[256 * q + i] != static_cast<uint8_t>(i + q);
    CHECK(wrong == 0);
    comm.broadcast(Ptr(digest.data(), DType::u8), digest.size(), 0);
    for (std::size_t i = 0; i < digest.size(); ++i) wrong += digest[i] != static_cast<uint8_t>(i);
    CHECK(wrong == 0);

    // Counted in their own sizes: 8 + 8 * 2 + 8 + 4 + 8 bytes reduced, 256 bytes gathered.
    CHECK(comm.stats().bytes_of(CommKind::all_reduce) == counted * (8 + 16 + 8 + 4 + 8));
    CHECK(comm.stats().bytes_of(CommKind::all_gather) == counted * 256);
    CHECK(comm.stats().bytes_of(CommKind::broadcast) == counted * (8 + 256));

    // A type that cannot be added is refused before any communication.
    uint8_t yes = 1;
    CHECK_THROWS_AS(comm.all_reduce(Ptr(&yes, DType::boolean), 1), trident::Error);
    comm.barrier();
}

TEST_CASE("fp16 overflow: every rank of the grid skips the same steps and halves the scale",
          "[mpi][training]") {
    const int n = world().size();
    const GridShape shape = n == 8   ? GridShape{2, 2, 2}
                            : n == 4 ? GridShape{1, 2, 2}
                                     : GridShape{1, 1, n};
    Grid grid(world(), shape);
    // A loss scale far too large for fp16: the first backward passes overflow.
    const trident::config::Config cfg = trident::config::parse(
        "model: {vocab_size: 64, seq_len: 8, layers: 2, hidden: 16, heads: 4, ffn_hidden: 32}\n"
        "parallel: {pipeline: " +
            std::to_string(shape.pipeline) + ", tensor: " + std::to_string(shape.tensor) +
            ", data: " + std::to_string(shape.data) +
            "}\n"
            "training: {micro_batch: 1, global_batch: " +
            std::to_string(2 * shape.data) +
            ", steps: 16, warmup_steps: 1, threads: 1, precision: fp16, loss_scale: 16777216}\n"
            "data: {train: unused.bin}\n",
        "overflow.yaml");
    auto ops = trident::kernels::make_cpu_ops(1);
    trident::train::Trainer trainer(cfg, *ops, grid);
    trident::model::init_random(trainer.model().weights(), cfg.training.seed, 0.02f);
    const trident::train::SampleFn tokens = [](uint64_t k, std::span<int32_t> in,
                                               std::span<int32_t> tgt) {
        for (std::size_t i = 0; i < in.size(); ++i) {
            in[i] = static_cast<int32_t>(trident::kernels::hash64(k, i) % 64);
            tgt[i] = static_cast<int32_t>(trident::kernels::hash64(k, i + 1) % 64);
        }
    };
    std::vector<float> skipped, scales;
    double scale = 16777216;
    int applied = 0;
    for (int s = 0; s < 16; ++s) {
        const trident::train::StepResult r = trainer.step(s, tokens);
        CHECK(r.loss_scale == scale);
        scale = r.skipped ? scale / 2 : scale;
        applied += !r.skipped;
        CHECK(std::isfinite(r.loss));
        skipped.push_back(r.skipped ? 1.0f : 0.0f);
        scales.push_back(static_cast<float>(r.loss_scale));
    }
    CHECK(skipped[0] == 1.0f);  // the first step overflowed
    CHECK(applied > 0);         // and training went on once the scale fit
    CHECK(scale < 16777216);
    if (world().rank() == 0) WARN(applied << " of 16 steps applied, loss scale now " << scale);
    // Every rank took the same decisions.
    std::vector<float> all(skipped.size() * n);
    world().comm().all_gather(skipped.data(), all.data(), skipped.size());
    for (int q = 0; q < n; ++q)
        for (std::size_t i = 0; i < skipped.size(); ++i)
            CHECK(all[q * skipped.size() + i] == skipped[i]);
}

TEST_CASE("failure: any_rank_failed agrees on every rank", "[mpi]") {
    const int n = world().size(), r = world().rank();
    CHECK_FALSE(any_rank_failed(world(), false));
    CHECK(any_rank_failed(world(), true));
    CHECK(any_rank_failed(world(), r == n - 1));
    CHECK(any_rank_failed(world(), r == 0));
}

int main(int argc, char** argv) {
    World world(argc, argv);
    the_world = &world;
    // Each rank prints its own failures, under a header that names the rank.
    Catch::Session session;
    session.configData().name = "trident_mpi_tests rank " + std::to_string(world.rank()) + " of " +
                                std::to_string(world.size());
    const int failures = session.run(argc, argv);
    const bool failed = any_rank_failed(world, failures != 0);
    if (failed && world.rank() == 0)
        std::fprintf(stderr, "trident_mpi_tests: failed on at least one of %d ranks\n",
                     world.size());
    return failed ? 1 : 0;
}
