// trident_data_fill_bench: times what a training step asks of its data, Dataset::fill of each
// sample of the global batch (data/dataset.h), on one thread: the token ids copied from the
// mapped files and each checked against the vocabulary as it is read (data/token_stream.h).
// For docs/PERF.md's figure of that check's cost.
//
//   trident_data_fill_bench CONFIG [--set KEY=VALUE ...] [--steps N] [--repeat R]
//
// Fills the samples of steps 0 .. N-1 (those a run reads first), best of R passes after one
// untimed pass (the files in the page cache), and prints one JSON line: the tokens a step
// reads, microseconds per step and nanoseconds per token.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/dataset.h"

using namespace trident;

int main(int argc, char** argv) {
    CLI::App app{"Times Dataset::fill of a config's training data"};
    std::string config;
    std::vector<std::string> overrides;
    int steps = 20, repeat = 5;
    app.add_option("config", config, "YAML config file")->required();
    app.add_option("--set", overrides, "Override a config key (repeatable)")->take_all();
    app.add_option("--steps", steps, "Steps whose samples are filled")->capture_default_str();
    app.add_option("--repeat", repeat, "Timed passes (the best is reported)")
        ->capture_default_str();
    CLI11_PARSE(app, argc, argv);
    try {
        const config::Config cfg = config::load(config, overrides);
        data::Dataset train = data::open_train_data(cfg);
        const int T = cfg.model.seq_len;
        const uint64_t batch = static_cast<uint64_t>(cfg.training.global_batch);
        std::vector<int32_t> inputs(static_cast<std::size_t>(T)), targets(inputs.size());
        int64_t checksum = 0;  // keeps the copies from being optimised away
        double best = 1e30;
        for (int pass = 0; pass <= repeat; ++pass) {
            const auto t0 = std::chrono::steady_clock::now();
            for (uint64_t k = 0; k < batch * static_cast<uint64_t>(steps); ++k) {
                train.fill(k, inputs, targets);
                checksum += inputs[0] + targets[static_cast<std::size_t>(T) - 1];
            }
            const double s =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (pass > 0) best = std::min(best, s);  // pass 0 warms the page cache
        }
        const double tokens = static_cast<double>(batch) * (T + 1);
        std::printf(
            "{\"tokens_per_step\": %.0f, \"us_per_step\": %.1f, \"ns_per_token\": %.3f, "
            "\"checksum\": %lld}\n",
            tokens, 1e6 * best / steps, 1e9 * best / (tokens * steps),
            static_cast<long long>(checksum));
    } catch (const std::exception& e) {
        std::fprintf(stderr, "trident_data_fill_bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
