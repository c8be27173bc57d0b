// The loss over counted tokens (see token_loss.h).
#include "train/token_loss.h"

#include "model/documents.h"

namespace trident::train {

bool per_token_loss(const config::Config& cfg) {
    return cfg.training.loss_normalization == config::LossNormalization::tokens ||
           cfg.data.mask_eod_loss;
}

BatchCounts count_batch(const config::Config& cfg, const SampleFn& sample, uint64_t first,
                        int count, std::vector<int32_t>& window, std::vector<int32_t>& targets) {
    const int T = cfg.model.seq_len;
    const model::DocumentOptions o{cfg.data.documents == config::DocumentMode::mask,
                                   cfg.data.eod_token, cfg.data.mask_eod_loss};
    BatchCounts counts{static_cast<double>(count) * T, 0};
    if (!o.any()) return counts;
    window.resize(static_cast<std::size_t>(T));
    targets.resize(static_cast<std::size_t>(T));
    counts.counted = 0;
    for (int i = 0; i < count; ++i) {
        sample(first + static_cast<uint64_t>(i), window, targets);
        counts.counted += model::counted_positions(window.data(), T, o);
        if (!o.mask) continue;
        // A document starts at the window's first token and after each eod but the last.
        counts.documents +=
            1 + static_cast<double>(model::eod_rows(window.data(), 1, T - 1, o.eod).size());
    }
    return counts;
}

}  // namespace trident::train
