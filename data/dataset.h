// The data of a run: data.train or data.valid opened as one thing that fills global sample k.
//
// Each dataset of the list is one token stream (llm.c shards or a Megatron dataset) with its
// own Sampler; with several, a Blend decides which dataset global sample k comes from and
// which of its own samples it is. Training, validation and the tools all go through here, so
// they see the same samples for the same config.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/blend.h"
#include "data/sampler.h"
#include "data/token_stream.h"

namespace trident::data {

// Opens one dataset path as `format` says (auto: detect_format in megatron_dataset.h).
std::unique_ptr<TokenStream> open_stream(const std::string& path, config::DataFormat format,
                                         int vocab_size, const std::string& what);

class Dataset {
public:
    // Opens and checks every source up front. Dataset i samples its windows with its own
    // Sampler, shuffled (when `shuffle`) with seed_of(seed, i). `what` names the config key.
    Dataset(std::span<const config::DataSource> sources, config::DataFormat format, int vocab_size,
            int seq_len, bool shuffle, uint64_t seed, const std::string& what);

    // Inputs and targets (seq_len each) of global sample k.
    void fill(uint64_t sample, std::span<int32_t> inputs, std::span<int32_t> targets);

    // Which dataset, and which of its own samples, global sample k is.
    BlendPick pick(uint64_t sample) { return blend_.pick(sample); }

    std::size_t datasets() const { return streams_.size(); }
    const TokenStream& stream(std::size_t i) const { return *streams_[i]; }
    const Sampler& sampler(std::size_t i) const { return samplers_[i]; }
    double weight(std::size_t i) const { return blend_.weights()[i]; }  // normalised
    // Tokens in all datasets together.
    std::size_t tokens() const;

    // One line for the start-up summary: what was opened, its size, the blend.
    std::string summary() const;

    // Each file read, with the config key that names its dataset ("data.train", or in a
    // blend "data.train[2]"), in order.
    struct File {
        std::string key, path;
    };
    std::vector<File> files() const;

    // Dataset 0 keeps the run's seed, so a single dataset shuffles as it always has; the
    // others get seeds mixed from (seed, i), so no two datasets share a shuffle.
    static uint64_t seed_of(uint64_t seed, std::size_t dataset);

private:
    std::vector<std::unique_ptr<TokenStream>> streams_;  // heap: samplers point at them
    std::vector<std::string> keys_;                      // the config key of each
    std::vector<Sampler> samplers_;
    Blend blend_;
    bool shuffle_;
};

// cfg.data.train with the run's seed and shuffle setting.
Dataset open_train_data(const config::Config& cfg);

// cfg.data.valid, never shuffled; null when the config names none.
std::unique_ptr<Dataset> open_valid_data(const config::Config& cfg);

}  // namespace trident::data
