// The flat buffer's gaps (model/flat_buffer.h), whole and sharded: a 4-bit base's matrices are
// not held, the rest is, element for element; sharded, each unit's whole holds its elements
// past the gaps padded to a multiple of D, and the replicas' parts of it, gathered in order,
// are that whole.
#include <catch2/catch.hpp>
#include <memory>
#include <vector>

#include "kernels/ops.h"
#include "model/flat_buffer.h"

using trident::kernels::DType;
using trident::model::FlatBuffer;

namespace {

// Units [0, 6) [6, 16) [16, 20), gaps [2, 4) and [8, 13): held 4, 5 and 4 elements.
const std::vector<FlatBuffer::Range> kUnits = {{0, 6}, {6, 16}, {16, 20}};
const std::vector<FlatBuffer::Range> kGaps = {{2, 4}, {8, 13}};

bool in_gap(std::size_t i) {
    return (i >= 2 && i < 4) || (i >= 8 && i < 13);
}

std::vector<float> values() {
    std::vector<float> v(20);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i + 1);
    return v;
}

}  // namespace

TEST_CASE("flat buffer: gaps are not held, whole or sharded", "[flat_buffer]") {
    const std::unique_ptr<trident::kernels::Ops> ops = trident::kernels::make_cpu_ops(1);
    const std::vector<float> v = values();
    SECTION("whole") {
        FlatBuffer b(*ops, 20, DType::f32, kGaps);
        CHECK(b.shard_size() == 13);
        b.from_host(v);
        const std::vector<float> host = b.to_host();
        for (std::size_t i = 0; i < 20; ++i) CHECK(host[i] == (in_gap(i) ? 0.0f : v[i]));
        CHECK(static_cast<float*>(b.at(13).data) == static_cast<float*>(b.at(0).data) + 6);
        CHECK_THROWS(b.at(8));
    }
    SECTION("sharded over 2") {
        std::vector<FlatBuffer> replicas;
        for (int r = 0; r < 2; ++r) {
            replicas.emplace_back(*ops, kUnits, 2, r, DType::f32, kGaps);
            replicas.back().from_host(v);
        }
        // Parts of 2, 3 and 2 elements (5 held in unit 1, padded to 6).
        CHECK(replicas[0].shard_size() == 7);
        CHECK(replicas[0].part_size(1) == 3);
        std::vector<float> sum(20, 0.0f);
        for (const FlatBuffer& b : replicas) {
            const std::vector<float> host = b.to_host();
            for (std::size_t i = 0; i < 20; ++i) sum[i] += host[i];
        }
        for (std::size_t i = 0; i < 20; ++i) CHECK(sum[i] == (in_gap(i) ? 0.0f : v[i]));
        // Unit 1's whole as a gather makes it: replica 0's part, then replica 1's.
        FlatBuffer& b = replicas[0];
        b.acquire(1);
        for (int r = 0; r < 2; ++r)
            ops->copy(b.unit(1) + static_cast<std::size_t>(r) * 3,
                      replicas[static_cast<std::size_t>(r)].shard_part(1), 3);
        for (std::size_t i : {6u, 7u, 13u, 14u, 15u}) {
            float got = 0;
            ops->copy_to_host(&got, b.at(i), 1);
            CHECK(got == v[i]);
        }
        CHECK_THROWS(b.at(10));
        b.release(1);
    }
}
