// Which tokens of each sequence a context-parallel rank holds. With C ranks a sequence of T
// tokens is cut into 2·C chunks of S = T/(2C) tokens, and rank r holds chunk r then chunk
// 2C − 1 − r: under causal attention a late chunk attends to many keys and an early one to
// few, so every rank gets the same work (the load balancing of Megatron-Core's context
// parallelism). C = 1 holds the whole sequence in order.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace trident::model {

// The chunk (of 2C) that rank `rank` holds as its half 0 or 1.
inline int context_chunk(int rank, int half, int C) {
    return half == 0 ? rank : 2 * C - 1 - rank;
}

// The sequence positions of the T/C tokens rank `rank` holds, in the order it holds them.
std::vector<int32_t> context_positions(int T, int C, int rank);

// This rank's tokens of each of the B sequences of `all` (B, T): local (B, T/C).
void take_context_tokens(std::span<const int32_t> all, std::span<int32_t> local, int B, int T,
                         int C, int rank);

}  // namespace trident::model
