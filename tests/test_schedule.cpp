// Tests of the pipeline schedules (src/pipeline/schedule.h), proven by the simulator: PTD-P's
// bubble fractions, the in-flight limits, no deadlock for any valid (P, v, m), broken streams
// caught, the argument errors, and the drawings.
#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cli_support.h"
#include "kernels/error.h"
#include "pipeline/executor.h"
#include "pipeline/schedule.h"
#include "pipeline/simulator.h"
#include "pipeline/timeline.h"
#include "temp_dir.h"

using namespace trident;
using namespace trident::pipeline;

namespace {

std::vector<std::vector<Instr>> streams_of(Kind kind, int P, int v, int m) {
    std::vector<std::vector<Instr>> streams;
    for (int s = 0; s < P; ++s) streams.push_back(schedule(kind, P, v, m, s));
    return streams;
}

std::size_t count(const std::string& text, const std::string& what) {
    std::size_t n = 0;
    for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
        ++n;
    return n;
}

bool any_contains(const std::vector<std::string>& lines, const std::string& what) {
    return std::any_of(lines.begin(), lines.end(),
                       [&](const std::string& l) { return l.find(what) != std::string::npos; });
}

}  // namespace

TEST_CASE("schedule: 1F1B streams of a tiny pipeline, instruction by instruction", "[schedule]") {
    using I = Instr;
    // Stage 0 holds global chunk 0 (no input to receive, no gradient to send back); stage 1
    // the last (no output to send on, its gradient comes from the loss).
    CHECK(schedule(Kind::one_f_one_b, 2, 1, 2, 0) == std::vector<I>{{Op::forward, 0, 0},
                                                                    {Op::send_act, 0, 0},
                                                                    {Op::forward, 1, 0},
                                                                    {Op::send_act, 1, 0},
                                                                    {Op::recv_grad, 0, 0},
                                                                    {Op::backward, 0, 0},
                                                                    {Op::recv_grad, 1, 0},
                                                                    {Op::backward, 1, 0}});
    CHECK(schedule(Kind::one_f_one_b, 2, 1, 2, 1) == std::vector<I>{{Op::recv_act, 0, 0},
                                                                    {Op::forward, 0, 0},
                                                                    {Op::backward, 0, 0},
                                                                    {Op::send_grad, 0, 0},
                                                                    {Op::recv_act, 1, 0},
                                                                    {Op::forward, 1, 0},
                                                                    {Op::backward, 1, 0},
                                                                    {Op::send_grad, 1, 0}});
    // GPipe: every forward, then every backward.
    CHECK(schedule(Kind::gpipe, 2, 1, 2, 1) == std::vector<I>{{Op::recv_act, 0, 0},
                                                              {Op::forward, 0, 0},
                                                              {Op::recv_act, 1, 0},
                                                              {Op::forward, 1, 0},
                                                              {Op::backward, 0, 0},
                                                              {Op::send_grad, 0, 0},
                                                              {Op::backward, 1, 0},
                                                              {Op::send_grad, 1, 0}});
    // A single stage runs the whole model and talks to no one.
    for (const Instr& in : schedule(Kind::one_f_one_b, 1, 1, 3, 0))
        CHECK((in.op == Op::forward || in.op == Op::backward));
}

TEST_CASE("schedule: warm-up forwards as Megatron counts them", "[schedule]") {
    for (int P = 1; P <= 8; ++P)
        for (int s = 0; s < P; ++s) {
            CHECK(warmup_forwards(Kind::one_f_one_b, P, 1, 4 * P, s) == P - s - 1);
            CHECK(warmup_forwards(Kind::one_f_one_b, P, 1, 1, s) == std::min(P - s - 1, 1));
            CHECK(warmup_forwards(Kind::gpipe, P, 1, 5, s) == 5);
            for (int v = 2; v <= 4; ++v) {
                CHECK(warmup_forwards(Kind::interleaved, P, v, 4 * P, s) ==
                      std::min((P - s - 1) * 2 + (v - 1) * P, 4 * P * v));
                CHECK(warmup_forwards(Kind::interleaved, P, v, P, s) ==
                      std::min((P - s - 1) * 2 + (v - 1) * P, P * v));
            }
        }
}

TEST_CASE("schedule: interleaved order is Megatron's (groups of P per chunk)", "[schedule]") {
    // P = 4, v = 2, m = 8, stage 0: warm-up (4-0-1)*2 + (2-1)*4 = 10 forwards: microbatches
    // 0-3 through chunk 0, then through chunk 1, then 4-5 through chunk 0; then 1F1B, the
    // backwards starting with chunk 1 (the gradient enters at the last chunk).
    std::vector<std::pair<char, std::pair<int, int>>> compute;
    for (const Instr& in : schedule(Kind::interleaved, 4, 2, 8, 0))
        if (in.op == Op::forward || in.op == Op::backward)
            compute.push_back({in.op == Op::forward ? 'F' : 'B', {in.microbatch, in.chunk}});
    const std::vector<std::pair<char, std::pair<int, int>>> head = {
        {'F', {0, 0}}, {'F', {1, 0}}, {'F', {2, 0}}, {'F', {3, 0}}, {'F', {0, 1}},
        {'F', {1, 1}}, {'F', {2, 1}}, {'F', {3, 1}}, {'F', {4, 0}}, {'F', {5, 0}},
        {'F', {6, 0}}, {'B', {0, 1}}, {'F', {7, 0}}, {'B', {1, 1}}, {'F', {4, 1}},
        {'B', {2, 1}}, {'F', {5, 1}}, {'B', {3, 1}}, {'F', {6, 1}}, {'B', {0, 0}}};
    REQUIRE(compute.size() == 32);
    CHECK(std::vector(compute.begin(), compute.begin() + head.size()) == head);
    const std::vector<std::pair<char, std::pair<int, int>>> tail = {
        {'B', {4, 1}}, {'B', {5, 1}}, {'B', {6, 1}}, {'B', {7, 1}},
        {'B', {4, 0}}, {'B', {5, 0}}, {'B', {6, 0}}, {'B', {7, 0}}};
    CHECK(std::vector(compute.end() - tail.size(), compute.end()) == tail);

    // Stage 0's chunk 1 is global chunk 4: it receives its input from stage 3 and sends its
    // gradient back there; chunk 0 (global 0) receives nothing.
    const auto stream = schedule(Kind::interleaved, 4, 2, 8, 0);
    CHECK(stream.front() == Instr{Op::forward, 0, 0});
    CHECK(std::count(stream.begin(), stream.end(), Instr{Op::recv_act, 0, 1}) == 1);
    CHECK(std::count(stream.begin(), stream.end(), Instr{Op::recv_act, 0, 0}) == 0);
    CHECK(std::count(stream.begin(), stream.end(), Instr{Op::send_grad, 0, 1}) == 1);
    CHECK(std::count(stream.begin(), stream.end(), Instr{Op::send_grad, 0, 0}) == 0);
}

TEST_CASE("schedule: GPipe and 1F1B bubble is (p-1)/m", "[schedule]") {
    // Under equal costs per stage the pipeline fills and drains once: p - 1 forwards and
    // p - 1 backwards of idle per stage, whatever the ratio of backward to forward.
    for (const Costs costs : {Costs{1, 2, 0}, Costs{1, 1, 0}, Costs{0.5, 1.25, 0}})
        for (Kind kind : {Kind::gpipe, Kind::one_f_one_b})
            for (int P : {1, 2, 3, 4, 8})
                for (int m : {P, 2 * P, 4 * P, 1, 3, 5}) {
                    INFO(to_string(kind) << " P " << P << " m " << m << " f " << costs.forward
                                         << " b " << costs.backward);
                    const Simulation sim = simulate(kind, P, 1, m, costs);
                    REQUIRE(sim.valid());
                    CHECK(std::abs(sim.bubble_fraction - double(P - 1) / m) < 1e-12);
                    CHECK(std::abs(sim.bubble_fraction - bubble_formula(kind, P, 1, m)) < 1e-12);
                    CHECK(std::abs(sim.makespan - (m + P - 1) * (costs.forward + costs.backward)) <
                          1e-9);
                }
}

TEST_CASE("schedule: interleaved bubble is (p-1)/(v*m)", "[schedule]") {
    for (const Costs costs : {Costs{1, 2, 0}, Costs{1, 1, 0}})
        for (int P : {2, 3, 4, 8})
            for (int v : {2, 3, 4})
                for (int m : {P, 2 * P, 4 * P}) {
                    INFO("P " << P << " v " << v << " m " << m << " b " << costs.backward);
                    const Simulation sim = simulate(Kind::interleaved, P, v, m, costs);
                    REQUIRE(sim.valid());
                    CHECK(std::abs(sim.bubble_fraction - double(P - 1) / (v * m)) < 1e-12);
                    CHECK(std::abs(sim.bubble_fraction -
                                   bubble_formula(Kind::interleaved, P, v, m)) < 1e-12);
                }
    // The point of interleaving: for the same P and m, a v-th of 1F1B's bubble.
    CHECK(simulate(Kind::interleaved, 4, 2, 8).bubble_fraction ==
          Approx(simulate(Kind::one_f_one_b, 4, 1, 8).bubble_fraction / 2));
}

TEST_CASE("schedule: latency only lengthens the step", "[schedule]") {
    // With p2p latency the bubble grows past the formula: 1F1B's critical path crosses the
    // pipeline twice (forward and back), 2(p-1) messages.
    const Simulation fast = simulate(Kind::one_f_one_b, 4, 1, 8);
    const Simulation slow = simulate(Kind::one_f_one_b, 4, 1, 8, Costs{1, 2, 0.5});
    REQUIRE(slow.valid());
    CHECK(slow.makespan > fast.makespan);
    CHECK(slow.makespan >= fast.makespan + 2 * 3 * 0.5 - 1e-12);
    CHECK(slow.bubble_fraction > 3.0 / 8);
}

TEST_CASE("schedule: activations in flight", "[schedule]") {
    for (int P = 1; P <= 8; ++P)
        for (int m = 1; m <= 4 * P; ++m) {
            INFO("P " << P << " m " << m);
            const Simulation one_f_one_b = simulate(Kind::one_f_one_b, P, 1, m);
            const Simulation gpipe = simulate(Kind::gpipe, P, 1, m);
            for (int s = 0; s < P; ++s) {
                INFO("stage " << s);
                // 1F1B: P - s - 1 warm-up forwards and one more before the first backward.
                CHECK(one_f_one_b.stages[s].peak_in_flight <= P - s);
                CHECK(one_f_one_b.stages[s].peak_in_flight == std::min(P - s, m));
                CHECK(one_f_one_b.stages[s].peak_in_flight_microbatches == std::min(P - s, m));
                CHECK(gpipe.stages[s].peak_in_flight == m);
                CHECK(gpipe.stages[s].peak_in_flight_microbatches == m);
            }
        }
    for (int P = 1; P <= 8; ++P)
        for (int v = 2; v <= 4; ++v)
            for (int m = P; m <= 4 * P; m += P) {
                INFO("P " << P << " v " << v << " m " << m);
                const Simulation sim = simulate(Kind::interleaved, P, v, m);
                for (int s = 0; s < P; ++s) {
                    INFO("stage " << s);
                    const int warmup = warmup_forwards(Kind::interleaved, P, v, m, s);
                    CHECK(sim.stages[s].peak_in_flight == std::min(warmup + 1, m * v));
                    CHECK(sim.stages[s].peak_in_flight_microbatches <= m);
                    CHECK(sim.stages[s].peak_in_flight_microbatches * v >=
                          sim.stages[s].peak_in_flight);
                }
            }
    // PTD-P's example of the cost of interleaving: P = 4, v = 2, m = 8 holds 11 chunk
    // activations on stage 0 (5.5 stages' worth of layers) against 1F1B's 4.
    const Simulation sim = simulate(Kind::interleaved, 4, 2, 8);
    CHECK(sim.stages[0].peak_in_flight == 11);
    CHECK(sim.stages[0].peak_in_flight_microbatches == 8);
    CHECK(sim.stages[3].peak_in_flight == 5);
}

TEST_CASE("schedule: every valid (p, v, m) runs to the end, consistently", "[schedule]") {
    // Validity does not depend on the costs, but run a lopsided set too; and with the
    // executor's pool of send buffers (a compute waits for a free one).
    constexpr int K = Executor::kSendBuffers;
    for (const Costs costs : {Costs{}, Costs{1, 3, 0.7}, Costs{1, 2, 0, K}, Costs{1, 3, 0.7, K}})
        for (int P = 1; P <= 8; ++P) {
            for (Kind kind : {Kind::gpipe, Kind::one_f_one_b, Kind::zb_h1, Kind::zb_h2})
                for (int m = 1; m <= 4 * P; ++m) {
                    const Simulation sim = simulate(kind, P, 1, m, costs);
                    INFO(to_string(kind) << " P " << P << " m " << m << "\n"
                                         << sim.describe_problems());
                    CHECK(sim.valid());
                    CHECK(
                        std::all_of(sim.stages.begin(), sim.stages.end(), [&](const StageTrace& t) {
                            return t.done && (costs.send_buffers == 0 || t.peak_send_buffers <= K);
                        }));
                }
            for (int v = 2; v <= 4; ++v)
                for (int m = P; m <= 4 * P; m += P) {
                    const Simulation sim = simulate(Kind::interleaved, P, v, m, costs);
                    INFO("interleaved P " << P << " v " << v << " m " << m << "\n"
                                          << sim.describe_problems());
                    CHECK(sim.valid());
                    for (const StageTrace& t : sim.stages) {
                        CHECK(t.done);
                        if (costs.send_buffers > 0) CHECK(t.peak_send_buffers <= K);
                        CHECK(t.spans.size() == std::size_t(2 * m * v));
                        CHECK(t.busy == Approx(m * v * (costs.forward + costs.backward)));
                    }
                }
        }
    CHECK_NOTHROW(require_valid(simulate(Kind::interleaved, 8, 4, 32)));
}

TEST_CASE("schedule: too few send buffers deadlock, and the simulator says where", "[schedule]") {
    // Interleaved with v = 2 sends two messages before either is received: one buffer is not
    // enough, two are (the executor's pool).
    Costs one;
    one.send_buffers = 1;
    const Simulation sim = simulate(Kind::interleaved, 2, 2, 4, one);
    CHECK(sim.deadlock);
    CHECK_THAT(sim.deadlock_detail, Catch::Contains("for one of its 1 send buffers"));
    one.send_buffers = Executor::kSendBuffers;
    CHECK(simulate(Kind::interleaved, 2, 2, 4, one).valid());
    // Without a bound the messages a stage holds grow with the microbatches.
    CHECK(simulate(Kind::gpipe, 2, 1, 16).stages[0].peak_send_buffers == 16);
}

TEST_CASE("schedule: zero-bubble ZB-H1's bubble is Qi et al.'s (p-1)(F+B-W)/(m(F+B+W))",
          "[schedule][zero-bubble]") {
    for (int P = 2; P <= 8; ++P)
        for (int m = P; m <= 4 * P; ++m) {
            // F = B = W: a third of 1F1B's (p-1)/m.
            const Simulation equal = simulate(Kind::zb_h1, P, 1, m, Costs{1, 2, 0, 0, 1});
            INFO("P " << P << " m " << m << "\n" << equal.describe_problems());
            REQUIRE(equal.valid());
            CHECK(equal.bubble_fraction == Approx(bubble_formula(Kind::zb_h1, P, 1, m)));
            CHECK(bubble_formula(Kind::zb_h1, P, 1, m) ==
                  Approx(bubble_formula(Kind::one_f_one_b, P, 1, m) / 3));
            // Costs as a transformer's measure them (B above F, W below it).
            for (const auto& [f, b, w] : {std::tuple{1.0, 1.2, 0.8}, std::tuple{1.0, 1.1, 0.9}}) {
                const Simulation sim = simulate(Kind::zb_h1, P, 1, m, Costs{f, b + w, 0, 0, w});
                CHECK(sim.bubble_fraction == Approx((P - 1) * (f + b - w) / (m * (f + b + w))));
            }
        }
}

TEST_CASE("schedule: ZB-H1 holds 1F1B's peak of activations, ZB-H2 at most 2p-1",
          "[schedule][zero-bubble]") {
    for (int P = 1; P <= 8; ++P)
        for (int m = 1; m <= 3 * P; ++m) {
            const auto peak = [](const Simulation& sim) {
                int most = 0;
                for (const StageTrace& t : sim.stages) most = std::max(most, t.peak_in_flight);
                return most;
            };
            const Simulation one = simulate(Kind::one_f_one_b, P, 1, m);
            const Simulation h1 = simulate(Kind::zb_h1, P, 1, m);
            const Simulation h2 = simulate(Kind::zb_h2, P, 1, m);
            INFO("P " << P << " m " << m);
            REQUIRE(h1.valid());
            REQUIRE(h2.valid());
            CHECK(peak(h1) == peak(one));
            CHECK(peak(h2) <= 2 * P - 1);
            CHECK(h2.makespan <= h1.makespan);
            CHECK(h1.makespan <= one.makespan);
        }
    // With latency, ZB-H2's earlier forwards keep the pipeline fuller.
    const Costs slow{1, 2, 0.5, 0, 1};
    CHECK(simulate(Kind::zb_h2, 4, 1, 8, slow).bubble_fraction <
          simulate(Kind::zb_h1, 4, 1, 8, slow).bubble_fraction);
}

TEST_CASE("schedule: zero-bubble streams split every backward into B then W",
          "[schedule][zero-bubble]") {
    // One stage: forward, B, W for each microbatch in turn.
    const std::vector<Instr> one = schedule(Kind::zb_h1, 1, 1, 3, 0);
    const std::vector<Instr> expected = {
        {Op::forward, 0, 0}, {Op::backward_input, 0, 0}, {Op::backward_weight, 0, 0},
        {Op::forward, 1, 0}, {Op::backward_input, 1, 0}, {Op::backward_weight, 1, 0},
        {Op::forward, 2, 0}, {Op::backward_input, 2, 0}, {Op::backward_weight, 2, 0}};
    CHECK(one == expected);
    // W's of a stage come in microbatch order (so each gradient adds them as 1F1B does).
    for (Kind kind : {Kind::zb_h1, Kind::zb_h2})
        for (int s = 0; s < 4; ++s) {
            int next = 0;
            for (const Instr& in : schedule(kind, 4, 1, 12, s))
                if (in.op == Op::backward_weight) CHECK(in.microbatch == next++);
            CHECK(next == 12);
        }
    CHECK_THROWS_WITH(schedule(Kind::zb_h1, 2, 2, 4, 0),
                      Catch::Contains("parallel.virtual_stages must be 1"));
    CHECK(parse_kind("zb-h2") == Kind::zb_h2);
}

TEST_CASE("schedule: broken streams are caught", "[schedule]") {
    auto index_of = [](const std::vector<Instr>& stream, Instr in) {
        return std::size_t(std::find(stream.begin(), stream.end(), in) - stream.begin());
    };

    SECTION("two receives swapped: deadlock") {
        // The last stage waits for microbatch 7's activation, which stage 2 sends only after
        // it has had microbatch 0's gradient, which the last stage never computes.
        auto streams = streams_of(Kind::one_f_one_b, 4, 1, 8);
        auto& last = streams[3];
        std::swap(last[index_of(last, {Op::recv_act, 0, 0})],
                  last[index_of(last, {Op::recv_act, 7, 0})]);
        const Simulation sim = simulate(streams, 1, 8);
        CHECK(sim.deadlock);
        CHECK(!sim.valid());
        INFO(sim.deadlock_detail);
        CHECK(sim.deadlock_detail.find("stage 3 waits at instruction 0 recv_act(mb 7, chunk 0) "
                                       "for send_act(mb 7, chunk 0) from stage 2") !=
              std::string::npos);
        CHECK(any_contains(sim.problems, "no recv_act before it"));
        CHECK_THROWS_AS(require_valid(sim), Error);
    }
    SECTION("a dropped send: deadlock and an unmatched receive") {
        auto streams = streams_of(Kind::interleaved, 2, 2, 4);
        auto& s1 = streams[1];
        s1.erase(s1.begin() + index_of(s1, {Op::send_grad, 3, 0}));
        const Simulation sim = simulate(streams, 2, 4);
        CHECK(sim.deadlock);
        CHECK(sim.deadlock_detail.find("stage 0 waits") != std::string::npos);
        CHECK(any_contains(sim.problems,
                           "recv_grad(mb 3, chunk 0): no matching send (expected "
                           "send_grad(mb 3, chunk 0) on stage 1)"));
        CHECK(any_contains(sim.problems, "never sends its input's gradient back"));
    }
    SECTION("a send and its receive both dropped: no deadlock, still inconsistent") {
        auto streams = streams_of(Kind::one_f_one_b, 3, 1, 3);
        streams[0].erase(streams[0].begin() + index_of(streams[0], {Op::send_act, 1, 0}));
        streams[1].erase(streams[1].begin() + index_of(streams[1], {Op::recv_act, 1, 0}));
        const Simulation sim = simulate(streams, 1, 3);
        CHECK(!sim.deadlock);
        CHECK(!sim.valid());
        CHECK(any_contains(sim.problems, "stage 1, instruction"));
        CHECK(any_contains(sim.problems, "forward(mb 1, chunk 0): no recv_act before it"));
        CHECK(any_contains(sim.problems, "microbatch 1, chunk 0 never sends its output on"));
    }
    SECTION("a send twice: the extra has no receive") {
        auto streams = streams_of(Kind::gpipe, 2, 1, 2);
        auto& s0 = streams[0];
        s0.insert(s0.begin() + index_of(s0, {Op::send_act, 0, 0}), Instr{Op::send_act, 0, 0});
        const Simulation sim = simulate(streams, 1, 2);
        CHECK(!sim.deadlock);
        CHECK(any_contains(sim.problems, "sent twice"));
        CHECK(any_contains(sim.problems, "no matching receive"));
    }
    SECTION("backward before forward, a missing microbatch, a bad chunk") {
        auto streams = streams_of(Kind::gpipe, 1, 1, 3);
        auto& s0 = streams[0];
        std::swap(s0[index_of(s0, {Op::forward, 2, 0})], s0[index_of(s0, {Op::backward, 2, 0})]);
        s0.push_back({Op::forward, 0, 1});
        s0.erase(s0.begin() + index_of(s0, {Op::backward, 1, 0}));
        const Simulation sim = simulate(streams, 1, 3);
        CHECK(any_contains(sim.problems, "backward(mb 2, chunk 0): backward before its forward"));
        CHECK(any_contains(sim.problems, "microbatch 1, chunk 0 is never backwarded"));
        CHECK(any_contains(sim.problems, "chunk outside 0 .. 0"));
    }
    SECTION("talking past the ends of the model") {
        auto streams = streams_of(Kind::one_f_one_b, 2, 1, 1);
        streams[1].push_back({Op::send_act, 0, 0});  // the last chunk has no next one
        streams[0].insert(streams[0].begin(), Instr{Op::recv_act, 0, 0});  // chunk 0: embedding
        const Simulation sim = simulate(streams, 1, 1);
        CHECK(any_contains(sim.problems, "the last global chunk has no next chunk to send to"));
        CHECK(any_contains(sim.problems, "global chunk 0 takes the embedding"));
        CHECK(sim.deadlock);
    }
}

TEST_CASE("schedule: invalid arguments are named", "[schedule][bad-input]") {
    auto message = [](auto&& call) -> std::string {
        try {
            call();
        } catch (const Error& e) {
            return e.what();
        }
        return "(no error)";
    };
    CHECK(message([] { schedule(Kind::interleaved, 4, 2, 6, 0); }) ==
          "pipeline: the interleaved schedule needs the microbatches per step (6) to be a "
          "multiple of parallel.pipeline (4)");
    CHECK(message([] { schedule(Kind::interleaved, 4, 1, 8, 0); }) ==
          "pipeline: the interleaved schedule needs parallel.virtual_stages >= 2 (got 1); use "
          "1f1b for one chunk per stage");
    CHECK(message([] { schedule(Kind::one_f_one_b, 4, 2, 8, 0); }) ==
          "pipeline: the 1f1b schedule runs one chunk per stage; parallel.virtual_stages must "
          "be 1 (got 2) or the schedule interleaved");
    CHECK(message([] { schedule(Kind::gpipe, 0, 1, 8, 0); }) ==
          "pipeline: parallel.pipeline must be at least 1 (got 0)");
    CHECK(message([] { schedule(Kind::gpipe, 2, 1, 0, 0); }) ==
          "pipeline: the microbatches per step must be at least 1 (got 0)");
    CHECK(message([] { schedule(Kind::gpipe, 2, 1, 4, 2); }) ==
          "pipeline: stage 2 is outside the pipeline's stages 0 .. 1");
    CHECK(message([] { simulate(Kind::interleaved, 3, 2, 4); }) ==
          "pipeline: the interleaved schedule needs the microbatches per step (4) to be a "
          "multiple of parallel.pipeline (3)");
    CHECK(message([] { parse_kind("zb-x"); }) ==
          "pipeline: unknown schedule 'zb-x' (expected gpipe, 1f1b, interleaved, zb-h1, zb-h2 or "
          "zb-v)");
    CHECK(message([] {
              simulate(Kind::gpipe, 2, 1, 2, Costs{0, 0, 0});
          }).find("costs") != std::string::npos);
    for (Kind kind : {Kind::gpipe, Kind::one_f_one_b, Kind::interleaved})
        CHECK(parse_kind(to_string(kind)) == kind);
}

TEST_CASE("schedule: text timeline of a tiny pipeline", "[schedule]") {
    // 1F1B, P = 2, m = 2, forward 1, backward 2: a 9-unit step, (2+1)·3.
    CHECK(render_text(simulate(Kind::one_f_one_b, 2, 1, 2)) ==
          "stage 0 |ab..AA.BB|\n"
          "stage 1 |.aAAbBB..|\n");
    CHECK(render_text(simulate(Kind::gpipe, 2, 1, 2)) ==
          "stage 0 |ab...AABB|\n"
          "stage 1 |.abAABB..|\n");
    // Half-unit costs draw at two columns per unit.
    CHECK(text_columns_per_unit(Costs{0.5, 1, 0}) == 2);
    CHECK(render_text(simulate(Kind::one_f_one_b, 1, 1, 2, Costs{0.5, 1, 0})) ==
          "stage 0 |aAAbBB|\n");
}

TEST_CASE("schedule: SVG timeline", "[schedule]") {
    for (const auto& [kind, v] :
         {std::pair{Kind::one_f_one_b, 1}, std::pair{Kind::interleaved, 2}}) {
        const Simulation sim = simulate(kind, 4, v, 8);
        const std::string svg = render_svg(sim);
        REQUIRE(svg.rfind("<svg", 0) == 0);
        CHECK(svg.substr(svg.size() - 7) == "</svg>\n");
        CHECK(count(svg, "<g class=\"stage\"") == 4);
        CHECK(count(svg, "</g>") == 4);
        CHECK(count(svg, "<rect class=\"forward\"") == std::size_t(4 * 8 * v));
        CHECK(count(svg, "<rect class=\"backward\"") == std::size_t(4 * 8 * v));
        CHECK(count(svg, "<text") == count(svg, "</text>"));
        CHECK(svg.find("P = 4, v = " + std::to_string(v) + ", m = 8, bubble") != std::string::npos);
        // Every stage's row holds its own boxes.
        for (int s = 0; s < 4; ++s) {
            const auto begin = svg.find("<g class=\"stage\" data-stage=\"" + std::to_string(s));
            REQUIRE(begin != std::string::npos);
            const std::string row = svg.substr(begin, svg.find("</g>", begin) - begin);
            CHECK(count(row, "<rect class=") == std::size_t(2 * 8 * v));
        }
    }
    CHECK(render_svg(simulate(Kind::interleaved, 4, 2, 8)).find("Interleaved 1F1B") !=
          std::string::npos);
}

TEST_CASE("schedule: the command prints the timeline and writes the SVG", "[schedule][cli]") {
    TempDir tmp("schedule_cli");
    const std::string svg = tmp / "s.svg";
    const cli::RunResult r = cli::run(
        "schedule --kind interleaved --pipeline 4 --microbatches 8 --virtual 2 --svg " + svg);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(r.output.find("bubble fraction: 0.187500 measured, 0.187500 formula (p-1)/(v*m)") !=
          std::string::npos);
    CHECK(r.output.find("stage 3 |") != std::string::npos);
    CHECK(std::filesystem::file_size(svg) > 0);

    const cli::RunResult bad =
        cli::run("schedule --kind interleaved --pipeline 4 --microbatches 6");
    CHECK(bad.exit_code == 1);
    CHECK(bad.output.find("trident: error: pipeline: the interleaved schedule needs the "
                          "microbatches per step (6)") != std::string::npos);
}
