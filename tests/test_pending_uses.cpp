// The record of device memory in use on other streams (kernels/cuda/pending_uses.h), with
// events that are plain numbers the test says have happened or not: a block released while a
// use of it is under way makes the compute stream wait for that use, once; a block no use
// overlaps, or whose uses are done, waits for nothing.
#include <catch2/catch.hpp>
#include <set>
#include <vector>

#include "kernels/cuda/pending_uses.h"

using trident::kernels::cuda::PendingUses;

namespace {

struct Events {
    std::set<int> happened;
    std::vector<int> waited;
    auto happened_fn() {
        return [this](int e) { return happened.count(e) > 0; };
    }
    auto wait_fn() {
        return [this](int e) { waited.push_back(e); };
    }
};

}  // namespace

TEST_CASE("pending uses: reuse of memory under way waits for exactly its uses", "[pending-uses]") {
    std::vector<char> memory(1000);
    const char* base = memory.data();
    PendingUses<int> uses;
    Events events;
    uses.add(base + 100, 100, 1, events.happened_fn());  // [100, 200) until event 1
    uses.add(base + 300, 50, 2, events.happened_fn());   // [300, 350) until event 2
    uses.add(base + 0, 0, 3, events.happened_fn());      // nothing
    REQUIRE(uses.size() == 2);

    // A block beside both uses touches neither: no wait, both kept.
    uses.before_reuse(base + 200, 100, events.happened_fn(), events.wait_fn());
    REQUIRE(events.waited.empty());
    REQUIRE(uses.size() == 2);

    // A block overlapping the first by one byte waits for event 1, once.
    uses.before_reuse(base + 199, 10, events.happened_fn(), events.wait_fn());
    REQUIRE(events.waited == std::vector<int>{1});
    REQUIRE(uses.size() == 1);
    uses.before_reuse(base + 150, 10, events.happened_fn(), events.wait_fn());
    REQUIRE(events.waited == std::vector<int>{1});

    // A use that has happened is forgotten without a wait.
    events.happened.insert(2);
    uses.before_reuse(base + 300, 50, events.happened_fn(), events.wait_fn());
    REQUIRE(events.waited == std::vector<int>{1});
    REQUIRE(uses.empty());
}

TEST_CASE("pending uses: a block spanning several uses waits for each", "[pending-uses]") {
    std::vector<char> memory(1000);
    const char* base = memory.data();
    PendingUses<int> uses;
    Events events;
    for (int e = 0; e < 4; ++e) uses.add(base + 100 * e, 100, e, events.happened_fn());
    events.happened.insert(1);
    uses.add(base + 900, 10, 9, events.happened_fn());  // forgets event 1's use
    REQUIRE(uses.size() == 4);
    uses.before_reuse(base + 50, 300, events.happened_fn(), events.wait_fn());  // [50, 350)
    REQUIRE(events.waited == std::vector<int>{0, 2, 3});
    REQUIRE(uses.size() == 1);  // event 9's, which the block does not touch
}
