// The `trident` binary: parses the command line and runs one subcommand. Every error a user
// can cause arrives here as an exception and leaves as one line on stderr and exit code 1.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

#include "commands/commands.h"

int main(int argc, char** argv) {
    using namespace trident;
    CLI::App app{"Trident: trains GPT language models on a pipeline x tensor x data grid."};
    app.require_subcommand(1);
    app.set_help_all_flag("--help-all", "Help for every subcommand");

    commands::TrainOptions train;
    auto* train_cmd = app.add_subcommand("train", "Train the configured model on its dataset");
    train_cmd->add_option("--config,-c", train.config, "YAML config file (see configs/)")
        ->required();
    train_cmd->add_option("--set", train.overrides,
                          "Override a config key, e.g. --set training.lr=3e-4 (repeatable)")
        ->take_all();

    commands::BenchOptions bench;
    auto* bench_cmd = app.add_subcommand(
        "bench", "Time training steps on random tokens; prints a JSON line last");
    bench_cmd->add_option("--config,-c", bench.config, "YAML config file (see configs/)")
        ->required();
    bench_cmd->add_option("--set", bench.overrides, "Override a config key (repeatable)")
        ->take_all();
    bench_cmd->add_option("--steps", bench.steps, "Timed steps (the median is reported)")
        ->capture_default_str();
    bench_cmd->add_option("--warmup", bench.warmup, "Untimed steps before the timed ones")
        ->capture_default_str();

    commands::ExportOptions exp;
    auto* export_cmd = app.add_subcommand(
        "export", "Write a checkpoint's model as Hugging Face GPT-2 safetensors");
    export_cmd->add_option("--checkpoint", exp.checkpoint,
                           "A checkpoint directory, or a checkpoint.dir (its newest is taken)")
        ->required();
    export_cmd->add_option("--output,-o", exp.output, "The .safetensors file to write")->required();

    commands::TokenizeOptions tok;
    auto* tokenize_cmd = app.add_subcommand("tokenize", "Turn text files into an llm.c token shard");
    tokenize_cmd->add_option("inputs", tok.inputs, "Text files, concatenated in order")->required();
    tokenize_cmd->add_option("--output,-o", tok.output, "The token shard to write")->required();
    tokenize_cmd->add_option("--tokenizer", tok.tokenizer, "bytes: one token per byte (vocab 256)")
        ->capture_default_str();

    CLI11_PARSE(app, argc, argv);
    try {
        if (*train_cmd) return commands::train(train);
        if (*bench_cmd) return commands::bench(bench);
        if (*export_cmd) return commands::export_model(exp);
        if (*tokenize_cmd) return commands::tokenize(tok);
    } catch (const std::exception& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "trident: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
