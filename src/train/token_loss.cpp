// The loss over counted tokens (see token_loss.h).
#include "train/token_loss.h"

#include "model/documents.h"

namespace trident::train {

bool per_token_loss(const config::Config& cfg) {
    return cfg.training.loss_normalization == config::LossNormalization::tokens ||
           cfg.data.mask_eod_loss;
}

double counted_positions(const config::Config& cfg, const SampleFn& sample, uint64_t first,
                         int count, std::vector<int32_t>& window, std::vector<int32_t>& targets) {
    const int T = cfg.model.seq_len;
    const model::DocumentOptions o{false, cfg.data.eod_token, cfg.data.mask_eod_loss};
    if (!o.mask_eod_loss) return static_cast<double>(count) * T;
    window.resize(static_cast<std::size_t>(T));
    targets.resize(static_cast<std::size_t>(T));
    double counted = 0;
    for (int i = 0; i < count; ++i) {
        sample(first + static_cast<uint64_t>(i), window, targets);
        counted += model::counted_positions(window.data(), T, o);
    }
    return counted;
}

}  // namespace trident::train
