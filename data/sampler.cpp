// The deterministic sampler (see sampler.h).
#include "data/sampler.h"

#include <algorithm>
#include <numeric>

#include "kernels/error.h"
#include "kernels/random.h"

namespace trident::data {

Sampler::Sampler(const TokenStream& tokens, int seq_len, bool shuffle, uint64_t seed,
                 const std::string& what)
    : tokens_(tokens),
      T_(seq_len),
      shuffle_(shuffle),
      seed_(seed),
      windows_(tokens.size() > 0 ? (tokens.size() - 1) / static_cast<std::size_t>(seq_len) : 0) {
    if (windows_ == 0)
        throw Error(what + ": " + std::to_string(tokens.size()) +
                    " tokens are too few for one sample of model.seq_len + 1 = " +
                    std::to_string(int64_t{seq_len} + 1) + " tokens");
    // Only now: a sample's scratch for a data set too small for one is never allocated.
    scratch_.resize(static_cast<std::size_t>(seq_len) + 1);
}

std::size_t Sampler::window_start(uint64_t sample) {
    const uint64_t index = sample % windows_;
    if (!shuffle_) return index * static_cast<std::size_t>(T_);
    const uint64_t epoch = sample / windows_;
    if (epoch != epoch_) {
        // Fisher-Yates driven by the counter-based hash: a pure function of (seed, epoch).
        order_.resize(windows_);
        std::iota(order_.begin(), order_.end(), 0u);
        const uint64_t epoch_seed = kernels::hash64(seed_, epoch);
        for (std::size_t i = windows_ - 1; i > 0; --i) {
            const std::size_t j = kernels::hash64(epoch_seed, i) % (i + 1);
            std::swap(order_[i], order_[j]);
        }
        epoch_ = epoch;
    }
    return static_cast<std::size_t>(order_[index]) * static_cast<std::size_t>(T_);
}

void Sampler::fill(uint64_t sample, std::span<int32_t> inputs, std::span<int32_t> targets) {
    tokens_.read(window_start(sample), scratch_);
    std::copy(scratch_.begin(), scratch_.end() - 1, inputs.begin());
    std::copy(scratch_.begin() + 1, scratch_.end(), targets.begin());
}

}  // namespace trident::data
