// A weighted blend of datasets: which dataset global sample k comes from, and which of that
// dataset's own samples it is.
//
// Sample k goes to the dataset that is furthest behind its share: the i maximising
// w_i·(k+1) − c_i(k), where c_i(k) counts the samples among 0..k−1 that went to i (ties to
// the lowest i). This is the greedy rule of Megatron-LM's blend builder (build_blending_indices
// in megatron/core/datasets/helpers.cpp, which uses max(k, 1) where we use k+1), so for every
// prefix of the sample order each count stays within about one sample of w_i·k. The result
// depends only on the weights and k, never on the layout or on the order samples are asked for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace trident::data {

struct BlendPick {
    std::size_t dataset;  // which dataset
    uint64_t sample;      // that dataset's own sample index: c_dataset(k)
};

class Blend {
public:
    // Weights must be finite and > 0; they are normalised to sum to 1.
    explicit Blend(std::vector<double> weights);

    std::size_t datasets() const { return weights_.size(); }
    const std::vector<double>& weights() const { return weights_; }  // normalised

    // The dataset and own index of global sample k. O(1) amortised for k visited in order;
    // the first visit to a far k walks every sample before it once (kept as one count
    // vector per block of kBlock samples, so each sample is walked once per run).
    BlendPick pick(uint64_t sample);

    static constexpr uint64_t kBlock = 4096;

private:
    // Walks the kBlock samples of block b from its start counts, leaving the counts at the
    // end of the block in `counts`; records each pick when `picks` is not null.
    void walk(uint64_t block, std::vector<uint64_t>& counts, std::vector<BlendPick>* picks) const;

    std::vector<double> weights_;
    std::vector<uint64_t> block_starts_;  // counts before block b: [b * datasets() + i]
    uint64_t cached_block_ = UINT64_MAX;  // the block `picks_` belongs to
    std::vector<BlendPick> picks_;        // each sample's pick in that block
};

}  // namespace trident::data
