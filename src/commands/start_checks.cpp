// Start-up checks of a training run (see start_checks.h).
#include "commands/start_checks.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "io/user_paths.h"
#include "kernels/error.h"

namespace trident::commands {

void check_logging_outputs(const config::Config& cfg) {
    const config::LoggingConfig& lg = cfg.logging;
    if (lg.metrics) io::check_output_file(*lg.metrics, "logging.metrics");
    if (lg.trace) io::check_output_file(*lg.trace, "logging.trace");
    if (lg.tensorboard) io::check_output_directory(*lg.tensorboard, "logging.tensorboard");
}

std::unique_ptr<data::Tokenizer> sample_tokenizer(const config::Config& cfg) {
    if (cfg.logging.sample_tokens <= 0) return nullptr;
    try {
        return data::tokenizer_for_vocab(cfg.model.vocab_size);
    } catch (const Error& e) {
        throw Error("logging.sample_tokens: the sample after training needs the tokenizer: " +
                    std::string(e.what()) + "; or set logging.sample_tokens: 0");
    }
}

std::string epochs_per_step(const config::Config& cfg, const data::Dataset& train) {
    const double batch = cfg.training.global_batch;
    std::string warning;
    for (std::size_t i = 0; i < train.datasets() && warning.empty(); ++i) {
        const double windows = static_cast<double>(train.sampler(i).windows());
        const double epochs = batch * train.weight(i) / windows;
        if (epochs <= 1) continue;
        char text[160];
        std::snprintf(text, sizeof text, "%.1f epochs of %s (%.0f samples)", epochs,
                      train.datasets() == 1 ? "data.train"
                                            : ("data.train[" + std::to_string(i + 1) + "]").c_str(),
                      windows);
        warning = "training.global_batch: " + std::to_string(cfg.training.global_batch) +
                  " sequences a step is " + text +
                  ": each step reads every sample more than once; a smaller global batch or "
                  "more data";
    }
    return warning;
}

std::string missing_eod(const config::Config& cfg, const data::Dataset& train) {
    if (cfg.data.documents != config::DocumentMode::mask) return "";
    for (std::size_t i = 0; i < train.datasets(); ++i) {
        const data::TokenStream& stream = train.stream(i);
        std::vector<int32_t> head(std::min(stream.size(), kEodProbe));
        stream.read(0, head);
        if (std::find(head.begin(), head.end(), cfg.data.eod_token) != head.end()) continue;
        return "data.documents: mask, but data.eod_token " + std::to_string(cfg.data.eod_token) +
               " is not among the first " + std::to_string(head.size()) + " tokens of " +
               stream.describe() + ": each window is one document";
    }
    return "";
}

}  // namespace trident::commands
