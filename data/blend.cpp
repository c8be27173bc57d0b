// The greedy weighted blend (see blend.h).
#include "data/blend.h"

#include <cmath>
#include <string>

#include "kernels/error.h"

namespace trident::data {

Blend::Blend(std::vector<double> weights) : weights_(std::move(weights)) {
    if (weights_.empty()) throw Error("a blend needs at least one dataset");
    double total = 0;
    for (double w : weights_) {
        if (!(w > 0) || !std::isfinite(w))
            throw Error("blend weights must be finite and > 0, got " + std::to_string(w));
        total += w;
    }
    for (double& w : weights_) w /= total;
    block_starts_.assign(weights_.size(), 0);  // block 0 starts with nothing drawn
}

void Blend::walk(uint64_t block, std::vector<uint64_t>& counts,
                 std::vector<BlendPick>* picks) const {
    const std::size_t n = weights_.size();
    for (uint64_t k = block * kBlock; k < (block + 1) * kBlock; ++k) {
        const double drawn = static_cast<double>(k + 1);
        std::size_t best = 0;
        double best_deficit = weights_[0] * drawn - static_cast<double>(counts[0]);
        for (std::size_t i = 1; i < n; ++i) {
            const double deficit = weights_[i] * drawn - static_cast<double>(counts[i]);
            if (deficit > best_deficit) {
                best = i;
                best_deficit = deficit;
            }
        }
        if (picks) picks->push_back({best, counts[best]});
        ++counts[best];
    }
}

BlendPick Blend::pick(uint64_t sample) {
    const std::size_t n = weights_.size();
    if (n == 1) return {0, sample};
    const uint64_t block = sample / kBlock;
    if (block != cached_block_) {
        // Extend the table of block start counts up to this block, then replay the block.
        std::vector<uint64_t> counts;
        while (block_starts_.size() / n <= block) {
            const uint64_t last = block_starts_.size() / n - 1;
            counts.assign(block_starts_.end() - static_cast<std::ptrdiff_t>(n),
                          block_starts_.end());
            walk(last, counts, nullptr);
            block_starts_.insert(block_starts_.end(), counts.begin(), counts.end());
        }
        const auto first = block_starts_.begin() + static_cast<std::ptrdiff_t>(block * n);
        counts.assign(first, first + static_cast<std::ptrdiff_t>(n));
        picks_.clear();
        walk(block, counts, &picks_);
        cached_block_ = block;
        // The counts after this block start the next: recorded so a run walks each block once.
        if (block_starts_.size() / n == block + 1)
            block_starts_.insert(block_starts_.end(), counts.begin(), counts.end());
    }
    return picks_[sample % kBlock];
}

}  // namespace trident::data
