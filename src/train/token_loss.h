// The loss over counted tokens (training.loss_normalization: tokens, and data.mask_eod_loss;
// model/documents.h): the step's loss is the sum of the counted losses over the counted
// positions of the whole global batch (Megatron's calculate_per_token_loss), so every layout and
// micro-batch size gives the same loss and gradients. Each token's gradient is weighted by
// 1 / (counted positions), and a position the head drops counts nothing. Under data.documents:
// mask the same pass over the global batch counts its documents for the metrics.
#pragma once

#include <cstdint>
#include <vector>

#include "config/config.h"
#include "train/trainer.h"

namespace trident::train {

// Whether the step's loss is over counted tokens rather than the mean of microbatch means.
bool per_token_loss(const config::Config& cfg);

// What a pass over whole windows counts: the positions whose loss counts, and the documents
// under data.documents: mask (each window's first token and every token after an eod within
// it start one; 0 otherwise).
struct BatchCounts {
    double counted = 0;
    double documents = 0;
};

// The counts of samples first .. first + count - 1, each a whole window read into `window`
// (seq_len tokens; the targets into `targets`); without mask_eod_loss every position counts.
BatchCounts count_batch(const config::Config& cfg, const SampleFn& sample, uint64_t first,
                        int count, std::vector<int32_t>& window, std::vector<int32_t>& targets);

}  // namespace trident::train
