// Tests of the grid order's arithmetic (no MPI): rank = tp + M*(dp + D*pp). The groups
// themselves are tested under mpirun in tests/mpi/.
#include <algorithm>
#include <catch2/catch.hpp>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "parallel/grid.h"

using namespace trident::parallel;

TEST_CASE("grid: the order is tp fastest, then dp, then pp", "[grid]") {
    const GridShape shape{2, 2, 2};  // P, M, D
    // (pp, dp, tp) of ranks 0..7
    const std::vector<std::tuple<int, int, int>> expected = {
        {0, 0, 0}, {0, 0, 1}, {0, 1, 0}, {0, 1, 1}, {1, 0, 0}, {1, 0, 1}, {1, 1, 0}, {1, 1, 1}};
    for (int rank = 0; rank < 8; ++rank) {
        const Coordinates c = coordinates_of(shape, rank);
        CHECK(std::tuple(c.pp, c.dp, c.tp) == expected[rank]);
    }
    // 4 stages, M = 2, D = 2: rank 13 = 1 + 2*(0 + 2*3) is stage 3, replica 0, shard 1.
    const Coordinates c = coordinates_of({4, 2, 2}, 13);
    CHECK(std::tuple(c.pp, c.dp, c.tp) == std::tuple(3, 0, 1));
    CHECK(rank_of({4, 2, 2}, {3, 0, 1}) == 13);
    CHECK(rank_of({1, 1, 1}, {0, 0, 0}) == 0);
}

TEST_CASE("grid: rank_of and coordinates_of are inverse for many shapes", "[grid]") {
    const std::vector<GridShape> shapes = {{1, 1, 1}, {1, 1, 8}, {1, 8, 1}, {8, 1, 1}, {2, 2, 2},
                                           {3, 2, 5}, {4, 1, 3}, {2, 8, 4}, {5, 3, 1}, {1, 6, 7}};
    for (const GridShape& g : shapes) {
        INFO("P " << g.pipeline << ", M " << g.tensor << ", D " << g.data);
        const int size = g.pipeline * g.tensor * g.data;
        std::set<int> seen;
        for (int pp = 0; pp < g.pipeline; ++pp)
            for (int dp = 0; dp < g.data; ++dp)
                for (int tp = 0; tp < g.tensor; ++tp) {
                    const int rank = rank_of(g, {pp, dp, tp});
                    CHECK(rank == tp + g.tensor * (dp + g.data * pp));
                    CHECK(rank >= 0);
                    CHECK(rank < size);
                    seen.insert(rank);
                    const Coordinates c = coordinates_of(g, rank);
                    CHECK(std::tuple(c.pp, c.dp, c.tp) == std::tuple(pp, dp, tp));
                }
        CHECK(static_cast<int>(seen.size()) == size);  // a bijection onto 0..size-1
    }
}

TEST_CASE("grid: tensor-parallel ranks are neighbours, stages the slowest axis", "[grid]") {
    const GridShape g{2, 4, 2};
    // The M ranks of one tensor group are consecutive (one node, fast links).
    for (int t = 0; t < 4; ++t) CHECK(rank_of(g, {1, 1, t}) == rank_of(g, {1, 1, 0}) + t);
    // One stage's ranks come before the next stage's.
    CHECK(rank_of(g, {0, 1, 3}) < rank_of(g, {1, 0, 0}));
    // Data-parallel replicas are M apart.
    CHECK(rank_of(g, {0, 1, 2}) - rank_of(g, {0, 0, 2}) == 4);
}

TEST_CASE("grid: context-parallel ranks sit between tensor and data, as Megatron's tp-cp-dp-pp",
          "[grid]") {
    // GridShape is {P, M, D, C}.
    const std::vector<GridShape> shapes = {{2, 2, 1, 2}, {1, 2, 2, 2}, {2, 1, 4, 3},
                                           {1, 1, 8, 1}, {3, 2, 2, 2}, {1, 1, 1, 4}};
    for (const GridShape& g : shapes) {
        INFO("P " << g.pipeline << ", M " << g.tensor << ", C " << g.context << ", D " << g.data);
        const int size = g.pipeline * g.tensor * g.context * g.data;
        std::set<int> seen;
        for (int pp = 0; pp < g.pipeline; ++pp)
            for (int dp = 0; dp < g.data; ++dp)
                for (int cp = 0; cp < g.context; ++cp)
                    for (int tp = 0; tp < g.tensor; ++tp) {
                        Coordinates want;
                        want.pp = pp;
                        want.dp = dp;
                        want.tp = tp;
                        want.cp = cp;
                        const int rank = rank_of(g, want);
                        CHECK(rank == tp + g.tensor * (cp + g.context * (dp + g.data * pp)));
                        seen.insert(rank);
                        const Coordinates c = coordinates_of(g, rank);
                        CHECK(std::tuple(c.pp, c.dp, c.cp, c.tp) == std::tuple(pp, dp, cp, tp));
                    }
        CHECK(static_cast<int>(seen.size()) == size);
        CHECK(*seen.rbegin() == size - 1);
    }
}

TEST_CASE("grid: groups by name are the grid order's runs, the expert axis within data-context",
          "[grid]") {
    // P 1, M 2, D 4, C 2: the data-context group of tp 0 is ranks 0, 2, 4, .. 14 (cp fastest).
    GridShape g{1, 2, 4, 2};
    g.expert = 4;
    const int rank = rank_of(g, {0, 1, 0, 1});  // dp 1, cp 1: place 3 of the data-context group
    CHECK(rank == 6);
    CHECK(group_ranks(g, Group::tensor, rank) == std::vector<int>{6, 7});
    CHECK(group_ranks(g, Group::context, rank) == std::vector<int>{4, 6});
    CHECK(group_ranks(g, Group::data, rank) == std::vector<int>{2, 6, 10, 14});
    CHECK(group_ranks(g, Group::data_context, rank) == std::vector<int>{0, 2, 4, 6, 8, 10, 12, 14});
    // Runs of E = 4 consecutive data-context ranks split the experts; the ranks with the same
    // place in each run hold the same experts.
    CHECK(group_ranks(g, Group::expert, rank) == std::vector<int>{0, 2, 4, 6});
    CHECK(group_ranks(g, Group::expert_data, rank) == std::vector<int>{6, 14});
    // Hybrid sharding cuts the same group, by data_shard (N = 4, a multiple of E = 2): the
    // experts' shard group is the run's ranks with this rank's place in the expert group.
    g.expert = 2;
    g.data_shard = 4;
    CHECK(group_ranks(g, Group::data_shard, rank) == std::vector<int>{0, 2, 4, 6});
    CHECK(group_ranks(g, Group::data_replica, rank) == std::vector<int>{6, 14});
    CHECK(group_ranks(g, Group::expert_data, rank) == std::vector<int>{2, 6, 10, 14});
    CHECK(group_ranks(g, Group::expert_shard, rank) == std::vector<int>{2, 6});
    CHECK(group_ranks(g, Group::expert_shard, 14) == std::vector<int>{10, 14});
    CHECK(std::string(group_name(Group::expert_data)) == "expert-data");
    CHECK(std::string(group_name(Group::expert_shard)) == "expert-shard");
    // Along an axis by name.
    CHECK(g.size(Axis::context) == 2);
    CHECK(coordinates_of(g, rank).along(Axis::data) == 1);
    // Every group holds its rank once, and its members are in the same group: the groups of
    // one kind partition the world.
    for (int k = 0; k < kGroups; ++k)
        for (int r = 0; r < 16; ++r) {
            const Group kind = static_cast<Group>(k);
            const std::vector<int> members = group_ranks(g, kind, r);
            CHECK(std::count(members.begin(), members.end(), r) == 1);
            for (int m : members) CHECK(group_ranks(g, kind, m) == members);
        }
}

namespace {

// The place of `rank` in its group of `g`.
int place_in(const GridShape& s, Group g, int rank) {
    const std::vector<int> members = group_ranks(s, g, rank);
    return static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
}

}  // namespace

TEST_CASE("grid: with hybrid sharding a replica partner holds the same experts' same shard",
          "[grid]") {
    // Every E dividing N dividing D·C = 8, M 2, C 2: the expert-shard group is N/E ranks of
    // the data-shard group; the ranks of a data-replica group (same q mod N) have the same
    // place in the expert group (the same experts) and in the expert-shard group (the same
    // part of them), which is what the replica all-reduce of the owned parts needs.
    for (const int N : {2, 4, 8})
        for (const int E : {1, 2, 4, 8}) {
            if (N % E != 0) continue;
            GridShape g{1, 2, 4, 2};
            g.data_shard = N;
            g.expert = E;
            INFO("N " << N << ", E " << E);
            for (int r = 0; r < 16; ++r) {
                const std::vector<int> shard = group_ranks(g, Group::expert_shard, r);
                CHECK(static_cast<int>(shard.size()) == N / E);
                for (int m : shard) {
                    CHECK(place_in(g, Group::data_shard, m) % E ==
                          place_in(g, Group::data_shard, r) % E);
                    CHECK(group_ranks(g, Group::data_shard, m) ==
                          group_ranks(g, Group::data_shard, r));
                    CHECK(group_ranks(g, Group::expert_data, m) ==
                          group_ranks(g, Group::expert_data, r));
                }
                for (int m : group_ranks(g, Group::data_replica, r)) {
                    CHECK(place_in(g, Group::expert, m) == place_in(g, Group::expert, r));
                    CHECK(place_in(g, Group::expert_shard, m) ==
                          place_in(g, Group::expert_shard, r));
                }
            }
        }
}
