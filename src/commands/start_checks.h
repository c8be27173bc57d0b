// What a training run checks at start-up beyond its config, so that what would fail at its
// end or under it is found before step 1 (docs/RELIABILITY.md, "What is found before step
// 1"): the files rank 0 writes, the tokenizer of the sample printed after training, a global
// batch larger than an epoch of its data, and documents without their end token.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "config/config.h"
#include "data/dataset.h"
#include "data/tokenizer.h"

namespace trident::commands {

// logging.metrics and logging.trace (a regular file or none, in a directory that is made and
// probed writable) and logging.tensorboard (a writable directory), on the rank that writes
// them. Throws trident::Error naming the key (io/user_paths.h).
void check_logging_outputs(const config::Config& cfg);

// The tokenizer the sample after training decodes with (logging.sample_tokens > 0), loaded
// now; null without a sample. Throws naming the key and what is missing.
std::unique_ptr<data::Tokenizer> sample_tokenizer(const config::Config& cfg);

// A warning when one step reads more than an epoch of a training dataset (a global batch of
// 16777216 sequences over a few thousand samples makes no visible progress for minutes), or
// "".
std::string epochs_per_step(const config::Config& cfg, const data::Dataset& train);

// Under data.documents: mask, a warning naming the token and the dataset when a training
// dataset holds no data.eod_token in its first kEodProbe tokens (tokenized without document
// ends, or another eod), or "".
inline constexpr std::size_t kEodProbe = std::size_t{1} << 20;
std::string missing_eod(const config::Config& cfg, const data::Dataset& train);

}  // namespace trident::commands
