// Tests of ZB-V (src/pipeline/schedule.h): the V-shaped placement of two chunks per stage,
// its streams proven valid by the simulator for every (P, m), and Qi et al.'s figures for it
// with F = B = W: the bubble of the V's start-up alone, (P - 1)/(6m), and 1F1B's peak of
// activations (2P chunks of half a stage's layers) on every stage; against 1F1B,
// interleaved, ZB-H1 and ZB-H2.
#include <algorithm>
#include <catch2/catch.hpp>
#include <vector>

#include "pipeline/executor.h"
#include "pipeline/schedule.h"
#include "pipeline/simulator.h"

using namespace trident;
using namespace trident::pipeline;

namespace {

int peak(const Simulation& sim) {
    int most = 0;
    for (const StageTrace& t : sim.stages) most = std::max(most, t.peak_in_flight);
    return most;
}

}  // namespace

TEST_CASE("zb-v: stage r holds chunks r and 2P-1-r, the first and the last on stage 0",
          "[schedule][zb-v]") {
    const model::ChunkMap v{model::Placement::v_shape, 4, 2};
    const std::vector<std::vector<int>> expected = {{0, 7}, {1, 6}, {2, 5}, {3, 4}};
    for (int r = 0; r < 4; ++r)
        for (int c = 0; c < 2; ++c) {
            const int g = v.global(r, c);
            CHECK(g == expected[r][c]);
            CHECK(v.stage_of(g) == r);
            CHECK(v.local(g) == c);
        }
    // Round robin, for comparison: chunk g on stage g mod P.
    const model::ChunkMap rr{model::Placement::round_robin, 4, 2};
    CHECK(rr.global(3, 1) == 7);
    CHECK(rr.stage_of(7) == 3);
    CHECK(model::StagePlan{4, 0, 2, {}, model::Placement::v_shape}.last());
    CHECK(!model::StagePlan{4, 3, 2, {}, model::Placement::v_shape}.last());
    CHECK(chunk_map(Kind::zb_v, 4, 2).placement == model::Placement::v_shape);
    CHECK(chunk_map(Kind::interleaved, 4, 2).placement == model::Placement::round_robin);
}

TEST_CASE("zb-v: every (p, m) runs to the end with F before B before W across stages",
          "[schedule][zb-v]") {
    // check_streams (inside simulate) proves each (microbatch, chunk) forwarded, B'd and W'd
    // once in that order, every input received from the stage holding the chunk before and
    // every gradient from the one after; the replay proves no stage waits forever, with
    // the executor's pool of send buffers too.
    constexpr int K = Executor::kSendBuffers;
    for (const Costs costs : {Costs{}, Costs{1, 3, 0.7}, Costs{1, 2, 0, K}, Costs{1, 3, 0.7, K}})
        for (int P = 2; P <= 8; ++P)
            for (int m = 1; m <= 4 * P; ++m) {
                const Simulation sim = simulate(Kind::zb_v, P, 2, m, costs);
                INFO("P " << P << " m " << m << "\n" << sim.describe_problems());
                REQUIRE(sim.valid());
                for (const StageTrace& t : sim.stages) {
                    CHECK(t.done);
                    CHECK(t.spans.size() == std::size_t(3 * 2 * m));
                    if (costs.send_buffers > 0) CHECK(t.peak_send_buffers <= K);
                }
            }
    // Each chunk's W's in microbatch order (each gradient adds them as 1F1B does), and on
    // stage 0 the embedding's chunk W's last (it announces the tied wte's gradient final).
    for (int s = 0; s < 4; ++s) {
        int next[2] = {0, 0};
        Instr last_w{};
        for (const Instr& in : schedule(Kind::zb_v, 4, 2, 12, s))
            if (in.op == Op::backward_weight) {
                CHECK(in.microbatch == next[in.chunk]++);
                last_w = in;
            }
        CHECK(next[0] == 12);
        CHECK(next[1] == 12);
        if (s == 0) CHECK(last_w == Instr{Op::backward_weight, 11, 0});
    }
    // The V's turn: stage P-1 sends chunk P-1's output to itself, and chunk 0 (stage 0)
    // takes the embedding, chunk 2P-1 (stage 0 too) the loss.
    const std::vector<Instr> turn = schedule(Kind::zb_v, 2, 2, 2, 1);
    CHECK(std::count(turn.begin(), turn.end(), Instr{Op::send_act, 0, 0}) == 1);
    CHECK(std::count(turn.begin(), turn.end(), Instr{Op::recv_act, 0, 1}) == 1);
    const std::vector<Instr> ends = schedule(Kind::zb_v, 2, 2, 2, 0);
    CHECK(std::count(ends.begin(), ends.end(), Instr{Op::recv_act, 0, 0}) == 0);
    CHECK(std::count(ends.begin(), ends.end(), Instr{Op::send_act, 0, 1}) == 0);
}

TEST_CASE("zb-v: with F = B = W its bubble is (p-1)/(6m) and it holds 1F1B's peak",
          "[schedule][zb-v]") {
    const Costs equal{1, 2, 0, 0, 1};  // per chunk: F 1, B 1, W 1
    for (int P = 2; P <= 8; ++P)
        for (int m = 2 * P; m <= 4 * P; ++m) {
            const Simulation v = simulate(Kind::zb_v, P, 2, m, equal);
            INFO("P " << P << " m " << m << "\n" << v.describe_problems());
            REQUIRE(v.valid());
            CHECK(v.bubble_fraction == Approx(bubble_formula(Kind::zb_v, P, 2, m)));
            CHECK(bubble_formula(Kind::zb_v, P, 2, m) ==
                  Approx(bubble_formula(Kind::zb_h1, P, 1, m) / 2));
            // Every stage holds at most 2P chunks, each half a stage's layers: 1F1B's P
            // microbatches on its stage 0, and no more on any stage.
            for (const StageTrace& t : v.stages) CHECK(t.peak_in_flight <= 2 * P);
            CHECK(peak(v) == 2 * peak(simulate(Kind::one_f_one_b, P, 1, m)));
            // Against the others with the same work per stage (a stage's F = B = W of 2).
            const Costs whole{2, 4, 0, 0, 2};
            CHECK(v.bubble_fraction < simulate(Kind::zb_h1, P, 1, m, whole).bubble_fraction);
            CHECK(v.bubble_fraction <= simulate(Kind::zb_h2, P, 1, m, whole).bubble_fraction);
            if (m % P == 0)
                CHECK(v.bubble_fraction < simulate(Kind::interleaved, P, 2, m).bubble_fraction);
        }
}

TEST_CASE("zb-v: refuses other than two chunks on two stages or more", "[schedule][zb-v]") {
    CHECK_THROWS_WITH(schedule(Kind::zb_v, 1, 2, 4, 0),
                      Catch::Contains("zb-v schedule needs parallel.pipeline >= 2"));
    CHECK_THROWS_WITH(schedule(Kind::zb_v, 4, 1, 4, 0),
                      Catch::Contains("parallel.virtual_stages must be 2"));
    CHECK_THROWS_WITH(schedule(Kind::zb_v, 4, 3, 4, 0),
                      Catch::Contains("parallel.virtual_stages must be 2"));
    CHECK(parse_kind("zb-v") == Kind::zb_v);
    CHECK(std::string(to_string(Kind::zb_v)) == "zb-v");
}
