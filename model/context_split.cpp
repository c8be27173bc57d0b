// The tokens of a context-parallel rank (see context_split.h).
#include "model/context_split.h"

#include <cstddef>

namespace trident::model {

std::vector<int32_t> context_positions(int T, int C, int rank) {
    const int S = T / (2 * C);
    std::vector<int32_t> positions;
    positions.reserve(static_cast<std::size_t>(T / C));
    if (C == 1) {
        for (int t = 0; t < T; ++t) positions.push_back(t);
        return positions;
    }
    for (int half = 0; half < 2; ++half)
        for (int t = 0; t < S; ++t) positions.push_back(context_chunk(rank, half, C) * S + t);
    return positions;
}

void take_context_tokens(std::span<const int32_t> all, std::span<int32_t> local, int B, int T,
                         int C, int rank) {
    const std::vector<int32_t> positions = context_positions(T, C, rank);
    const std::size_t L = positions.size();
    for (std::size_t b = 0; b < static_cast<std::size_t>(B); ++b)
        for (std::size_t t = 0; t < L; ++t)
            local[b * L + t] =
                all[b * static_cast<std::size_t>(T) + static_cast<std::size_t>(positions[t])];
}

}  // namespace trident::model
