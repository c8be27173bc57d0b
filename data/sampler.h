// The deterministic sampler: which window of the token stream is global sample k.
//
// The contract (docs/ARCHITECTURE.md, "Sampling"): with W = floor((N - 1) / T) windows of T tokens
// (plus one for the shifted targets), sample k without shuffling is window k mod W, starting at
// token (k mod W) * T. With shuffling, epoch e = k / W visits the windows in a permutation that
// depends only on (seed, e). The order depends only on k, never on the layout, so every
// P x M x C x D layout sees the same global batch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "data/token_stream.h"

namespace trident::data {

class Sampler {
public:
    Sampler(const TokenStream& tokens, int seq_len, bool shuffle, uint64_t seed,
            const std::string& what);

    std::size_t windows() const { return windows_; }
    // First token of global sample k.
    std::size_t window_start(uint64_t sample);
    // inputs and targets (T each) of global sample k.
    void fill(uint64_t sample, std::span<int32_t> inputs, std::span<int32_t> targets);

private:
    const TokenStream& tokens_;
    int T_;
    bool shuffle_;
    uint64_t seed_;
    std::size_t windows_;
    uint64_t epoch_ = UINT64_MAX;   // the epoch `order_` belongs to
    std::vector<uint32_t> order_;   // window order of that epoch
    std::vector<int32_t> scratch_;  // T + 1 tokens
};

}  // namespace trident::data
