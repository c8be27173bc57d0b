// The subcommands of the `trident` binary. main.cpp parses the command line (CLI11) and calls
// one of these; each returns the process exit code and throws trident::Error on bad input.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "parallel/world.h"
#include "train/generator.h"

namespace trident::commands {

struct TrainOptions {
    std::string config;
    std::vector<std::string> overrides;  // "key.path=value"
};
int train(const TrainOptions& opts, parallel::World& world);

struct BenchOptions {
    std::string config;
    std::vector<std::string> overrides;
    int steps = 10;
    int warmup = 2;
};
int bench(const BenchOptions& opts, parallel::World& world);

struct ExportOptions {
    std::string checkpoint;  // a checkpoint directory, or a checkpoint.dir (newest is taken)
    std::string output;      // .safetensors, or (format hf) a new or empty folder
    // safetensors: one file with config.json beside it; hf: a Hugging Face model folder,
    // llama weights sharded above shard_bytes (model/hf_weights.h).
    std::string format = "safetensors";
    uint64_t shard_bytes = 5'000'000'000;
    // A checkpoint of low-rank adapters needs one: the model with the adapters merged in, or
    // the adapters alone.
    bool merge_lora = false, lora_only = false;
};
int export_model(const ExportOptions& opts);

struct CheckpointInfoOptions {
    std::string path;  // a checkpoint directory, or a checkpoint.dir (its newest is shown)
};
// Prints the manifest and checks every file; exit code 1 if any is missing or corrupt.
int checkpoint_info(const CheckpointInfoOptions& opts);

struct TokenizeOptions {
    std::vector<std::string> inputs;  // text or JSON-lines files, or globs of them
    std::string output;               // llm.c shard path, or Megatron prefix
    std::string tokenizer = "gpt2";   // gpt2 | bytes | PATH.json
    std::string format = "llmc";      // llmc | megatron
    std::string split_on;             // record separator within files; empty = a file is a document
    std::string field = "text";       // JSON lines: the key whose string is a line's document
    uint64_t max_bad_lines = 0;       // JSON lines: malformed lines skipped before the run stops
    std::size_t shard_tokens = 0;     // split the output every N tokens; 0 = one output
    int threads = 0;                  // 0 = all cores
    bool progress = true;
};
int tokenize(const TokenizeOptions& opts);

struct GenerateOptions {
    // Hugging Face safetensors (a Llama's with config.json beside it) or model folder, or
    std::string weights;
    std::string checkpoint;  // a checkpoint directory (or a checkpoint.dir)
    std::string lora;        // with `weights`: an adapters file to merge into them
    std::string prompt;
    train::SamplingOptions sampling;
    // heads = hidden / head_dim for --weights (shapes do not tell); 0: from the config.json
    // beside them (trident export writes it), else 64 (every GPT-2 size).
    int head_dim = 0;
    int threads = 0;
};
int generate(const GenerateOptions& opts);

struct ScheduleOptions {
    std::string kind = "1f1b";         // gpipe | 1f1b | interleaved | zb-h1 | zb-h2
    int pipeline = 4;                  // P
    int microbatches = 8;              // m
    int virtual_stages = 0;            // v; 0 = 2 for interleaved, else 1
    std::string svg = "schedule.svg";  // empty: no SVG
    double forward_cost = 1.0;         // per chunk and microbatch
    double backward_cost = 2.0;
    double weight_cost = 1.0;  // of the backward, the W part (zero-bubble schedules)
    double latency = 0.0;      // per point-to-point message
    int send_buffers = 0;      // a stage's outgoing buffers; 0: unbounded
};
int schedule(const ScheduleOptions& opts);

struct PlanOptions {
    std::string config;
    std::vector<std::string> overrides;
    bool json = false;
    std::string device_memory;  // e.g. "80GiB"; empty: no check
    int zero_stage = -1;        // 0 .. 3 instead of parallel.zero_stage; -1: the config's
    int doc_len = -1;  // data.documents: mask: the documents' mean length in tokens; -1: not given
    // Hardware for the step time: a preset, and figures that replace its own (0: the preset's).
    std::string hardware;
    double gemm_tflops = 0;
    double mem_bw = 0;    // GB/s
    double intra_bw = 0;  // GB/s per GPU, one direction
    double inter_bw = 0;  // GB/s per GPU, one direction
    int gpus_per_node = 0;
    double latency_us = -1;  // per collective call; < 0: the preset's (or 20)
    double disk_bw = 0;      // GB/s to optimizer.offload_dir (reads and writes); 0: 2
    // --search: the fastest layouts of the config on `gpus` GPUs that fit (plan/search.h).
    bool search = false;
    int gpus = 0;                    // 0: not given
    int top = -1;                    // layouts listed (-1: not given, 10); 0: every one that fits
    std::vector<std::string> fixes;  // key=value held fixed
    bool allow_cross_node_tp = false;
};
int plan(const PlanOptions& opts);
int plan_search(const PlanOptions& opts);  // plan() runs it for --search

}  // namespace trident::commands
