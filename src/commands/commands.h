// The subcommands of the `trident` binary. main.cpp parses the command line (CLI11) and calls
// one of these; each returns the process exit code and throws trident::Error on bad input.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace trident::commands {

struct TrainOptions {
    std::string config;
    std::vector<std::string> overrides;  // "key.path=value"
};
int train(const TrainOptions& opts);

struct BenchOptions {
    std::string config;
    std::vector<std::string> overrides;
    int steps = 10;
    int warmup = 2;
};
int bench(const BenchOptions& opts);

struct ExportOptions {
    std::string checkpoint;  // a checkpoint directory, or a checkpoint.dir (newest is taken)
    std::string output;      // .safetensors
};
int export_model(const ExportOptions& opts);

struct TokenizeOptions {
    std::vector<std::string> inputs;  // text files, concatenated
    std::string output;               // llm.c token shard
    std::string tokenizer = "bytes";
};
int tokenize(const TokenizeOptions& opts);

}  // namespace trident::commands
