// The `trident` binary: parses the command line and runs one subcommand. Every error a user
// can cause arrives here as an exception and leaves as one line on stderr and exit code 1
// (train and bench, which run under mpirun, agree across ranks on that themselves).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <filesystem>

#include "commands/commands.h"
#include "io/output_file.h"
#include "io/user_paths.h"
#include "train/preemption.h"

#if defined(__SANITIZE_ADDRESS__)
// In the sanitizer build (scripts/sanitize.sh): Open MPI never frees what MPI_Init allocates and
// unloads its plugins before LeakSanitizer looks, so their leaks have no module a suppression
// could name. Leak checking is off by default for this binary, which starts MPI; the unit tests'
// binary keeps it, and AddressSanitizer's other checks stay on here.
extern "C" const char* __asan_default_options() {
    return "detect_leaks=0";
}
#endif

namespace trident {
namespace {

// `trident train`'s options and help.
CLI::App* add_train(CLI::App& app, commands::TrainOptions& train) {
    auto* train_cmd = app.add_subcommand("train", "Train the configured model on its dataset");
    train_cmd->add_option("--config,-c", train.config, "YAML config file (see configs/)")
        ->required();
    train_cmd
        ->add_option("--set", train.overrides,
                     "Override a config key, e.g. --set training.lr=3e-4 (repeatable)")
        ->take_all();
    return train_cmd;
}

// `trident bench`'s options and help.
CLI::App* add_bench(CLI::App& app, commands::BenchOptions& bench) {
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
    return bench_cmd;
}

// `trident export`'s options and help.
CLI::App* add_export(CLI::App& app, commands::ExportOptions& exp) {
    auto* export_cmd = app.add_subcommand(
        "export", "Write a checkpoint's model as Hugging Face safetensors (GPT-2 or Llama)");
    export_cmd
        ->add_option("--checkpoint", exp.checkpoint,
                     "A checkpoint directory, or a checkpoint.dir (its newest is taken)")
        ->required();
    export_cmd
        ->add_option("--output,-o", exp.output,
                     "The .safetensors file to write (config.json beside it); --format hf: a new "
                     "folder")
        ->required();
    export_cmd
        ->add_option("--format", exp.format,
                     "safetensors (one file) or hf (a Hugging Face model folder, as "
                     "save_pretrained writes)")
        ->capture_default_str();
    export_cmd
        ->add_option("--shard-size", exp.shard_bytes,
                     "--format hf: Llama weights above this many bytes go in shards")
        ->capture_default_str();
    auto* merge_opt =
        export_cmd->add_flag("--merge-lora", exp.merge_lora,
                             "Of a checkpoint of low-rank adapters: the model with them merged in");
    export_cmd
        ->add_flag("--lora-only", exp.lora_only,
                   "Of a checkpoint of low-rank adapters: the adapters alone (PEFT names)")
        ->excludes(merge_opt);
    return export_cmd;
}

// `trident checkpoint info`'s options and help; returns `info`, the subcommand that runs.
CLI::App* add_checkpoint_info(CLI::App& app, commands::CheckpointInfoOptions& info) {
    auto* checkpoint_cmd = app.add_subcommand("checkpoint", "Inspect training checkpoints");
    checkpoint_cmd->require_subcommand(1);
    auto* info_cmd = checkpoint_cmd->add_subcommand(
        "info", "Print a checkpoint's manifest and verify its files' checksums");
    info_cmd
        ->add_option("dir", info.path,
                     "A checkpoint directory, or a checkpoint.dir (its newest is shown)")
        ->required();
    return info_cmd;
}

// `trident tokenize`'s options and help.
CLI::App* add_tokenize(CLI::App& app, commands::TokenizeOptions& tok) {
    auto* tokenize_cmd =
        app.add_subcommand("tokenize", "Turn text files or JSON-lines corpora into training data");
    tokenize_cmd
        ->add_option("inputs", tok.inputs,
                     "Text files (each a document) or JSON lines (.jsonl, .json, .ndjson, plain "
                     "or .gz or .zst; each line a document), or globs of them ('raw/*.jsonl.zst')")
        ->required();
    tokenize_cmd
        ->add_option("--output,-o", tok.output,
                     "llm.c shard to write (OUT.bin), or Megatron prefix (OUT -> OUT.bin, OUT.idx)")
        ->required();
    tokenize_cmd
        ->add_option("--tokenizer", tok.tokenizer,
                     "gpt2 (GPT-2 BPE, vocab 50257), bytes (one id per byte, vocab 256), or the "
                     "path of a Hugging Face tokenizer.json (byte-level BPE)")
        ->capture_default_str();
    tokenize_cmd->add_option("--format", tok.format, "llmc (token shard) or megatron (.bin/.idx)")
        ->capture_default_str();
    tokenize_cmd->add_option("--split-on", tok.split_on,
                             "Split files into documents at this separator (escapes: \\n \\t)");
    tokenize_cmd
        ->add_option("--field", tok.field, "JSON lines: the key whose string is each document")
        ->capture_default_str();
    tokenize_cmd
        ->add_option("--max-bad-lines", tok.max_bad_lines,
                     "JSON lines: malformed lines to report and skip before stopping")
        ->capture_default_str();
    tokenize_cmd
        ->add_option("--shard-tokens", tok.shard_tokens,
                     "Write shards of at most N tokens (OUT_000000.bin, ...); 0 = one output")
        ->capture_default_str();
    tokenize_cmd->add_option("--threads", tok.threads, "Threads; 0 = all cores")
        ->capture_default_str();
    tokenize_cmd->add_flag("!--no-progress", tok.progress, "Do not show the progress line");
    return tokenize_cmd;
}

// `trident generate`'s options and help.
CLI::App* add_generate(CLI::App& app, commands::GenerateOptions& gen) {
    auto* generate_cmd = app.add_subcommand("generate", "Continue a prompt with trained weights");
    auto* weights_opt = generate_cmd->add_option("--weights", gen.weights,
                                                 "Hugging Face .safetensors (GPT-2, or Llama with "
                                                 "config.json beside it) or model folder");
    generate_cmd
        ->add_option("--checkpoint", gen.checkpoint,
                     "A checkpoint directory, or a checkpoint.dir (its newest is taken)")
        ->excludes(weights_opt);
    generate_cmd->add_option(
        "--lora", gen.lora,
        "Low-rank adapters (trident export --lora-only) to merge into the model of "
        "--weights or --checkpoint");
    generate_cmd->add_option("--prompt,-p", gen.prompt, "Text to continue (empty: a new document)");
    generate_cmd->add_option("--tokens,-n", gen.sampling.tokens, "Tokens to generate")
        ->capture_default_str();
    generate_cmd
        ->add_option("--temperature", gen.sampling.temperature,
                     "Softmax temperature, > 0; 0 = greedy (the likeliest token)")
        ->capture_default_str();
    generate_cmd->add_option("--top-k", gen.sampling.top_k, "Sample among the k likeliest; 0 = all")
        ->capture_default_str();
    generate_cmd->add_option("--seed", gen.sampling.seed, "Sampling seed")->capture_default_str();
    generate_cmd->add_option(
        "--head-dim", gen.head_dim,
        "With --weights: hidden / heads; default: from their config.json, else "
        "64 (every GPT-2 size)");
    generate_cmd->add_option("--threads", gen.threads, "CPU threads; 0 = all cores")
        ->capture_default_str();
    return generate_cmd;
}

// `trident schedule`'s options and help.
CLI::App* add_schedule(CLI::App& app, commands::ScheduleOptions& sched) {
    auto* schedule_cmd = app.add_subcommand(
        "schedule", "Simulate a pipeline schedule: text timeline, bubble, in-flight, SVG");
    schedule_cmd->add_option("--kind", sched.kind, "gpipe, 1f1b, interleaved, zb-h1, zb-h2 or zb-v")
        ->capture_default_str();
    schedule_cmd->add_option("--pipeline", sched.pipeline, "Pipeline stages P")
        ->capture_default_str();
    schedule_cmd->add_option("--microbatches", sched.microbatches, "Microbatches per step m")
        ->capture_default_str();
    schedule_cmd
        ->add_option("--virtual", sched.virtual_stages,
                     "Chunks per stage v; 0 = 2 for interleaved and zb-v, else 1")
        ->capture_default_str();
    schedule_cmd->add_option("--svg", sched.svg, "SVG file to write (\"\" for none)")
        ->capture_default_str();
    schedule_cmd->add_option("--forward-cost", sched.forward_cost, "Time of one chunk's forward")
        ->capture_default_str();
    schedule_cmd->add_option("--backward-cost", sched.backward_cost, "Time of one chunk's backward")
        ->capture_default_str();
    schedule_cmd
        ->add_option("--weight-cost", sched.weight_cost,
                     "Of the backward, the time of its W (zero-bubble schedules)")
        ->capture_default_str();
    schedule_cmd->add_option("--latency", sched.latency, "Time from a send to its receive")
        ->capture_default_str();
    schedule_cmd
        ->add_option("--send-buffers", sched.send_buffers,
                     "A stage's buffers for outgoing messages (0: unbounded)")
        ->capture_default_str();
    return schedule_cmd;
}

// `trident plan`'s options and help.
CLI::App* add_plan(CLI::App& app, commands::PlanOptions& plan) {
    auto* plan_cmd = app.add_subcommand(
        "plan", "Memory per rank, FLOPs, communication and step time of a config (no run)");
    plan_cmd->add_option("--config,-c", plan.config, "YAML config file (see configs/)")->required();
    plan_cmd->add_option("--set", plan.overrides, "Override a config key (repeatable)")->take_all();
    plan_cmd->add_flag("--json", plan.json, "Print one JSON object instead of text");
    plan_cmd->add_option("--device-memory", plan.device_memory,
                         "Memory per GPU to check every rank against, e.g. 80GiB or 40GB");
    plan_cmd->add_option("--zero-stage", plan.zero_stage,
                         "ZeRO stage 0-3 to plan instead of parallel.zero_stage");
    plan_cmd->add_option("--hardware", plan.hardware,
                         "Hardware preset for the step time: dgx2h-v100, dgx-a100 or dgx-h100");
    plan_cmd->add_option("--gemm-tflops", plan.gemm_tflops, "Achieved GEMM rate, TFLOP/s");
    plan_cmd->add_option("--mem-bw", plan.mem_bw, "Achieved memory bandwidth, GB/s");
    plan_cmd->add_option("--intra-bw", plan.intra_bw,
                         "Intra-node (NVLink) bandwidth per GPU, one direction, GB/s");
    plan_cmd->add_option("--inter-bw", plan.inter_bw,
                         "Inter-node bandwidth per GPU (the node's adapters / its GPUs), GB/s");
    plan_cmd->add_option("--gpus-per-node", plan.gpus_per_node, "GPUs per node");
    plan_cmd->add_option("--latency-us", plan.latency_us, "Latency per collective call, us");
    plan_cmd->add_option("--disk-bw", plan.disk_bw,
                         "Bandwidth between a rank and optimizer.offload_dir, its reads and writes "
                         "together, GB/s (default 2: one NVMe drive per rank)");
    plan_cmd->add_option("--doc-len", plan.doc_len,
                         "Under data.documents: mask, the documents' mean length in tokens: the "
                         "attention within them is counted (default: one document a window)");
    plan_cmd->add_flag("--search", plan.search,
                       "List the fastest layouts of the config on --gpus GPUs that fit in "
                       "--device-memory (or the preset GPU's)");
    plan_cmd->add_option("--gpus", plan.gpus, "--search: the GPUs to lay the run out on");
    plan_cmd->add_option("--top", plan.top,
                         "--search: how many layouts to list (default 10; 0: every one that fits)");
    plan_cmd->add_option("--fix", plan.fixes,
                         "--search: hold a key at a value, e.g. --fix parallel.tensor=8 "
                         "(repeatable)");
    plan_cmd->add_flag("--allow-cross-node-tp", plan.allow_cross_node_tp,
                       "--search: let tensor groups span nodes");
    return plan_cmd;
}

}  // namespace
}  // namespace trident

int main(int argc, char** argv) {
    using namespace trident;
    // A batch job's log takes stdout and stderr into one file, where stdout would otherwise be
    // fully buffered: its lines would land after an error printed later. Line by line, the log
    // keeps the order in which things happened.
    std::setvbuf(stdout, nullptr, _IOLBF, BUFSIZ);
    CLI::App app{
        "Trident: trains GPT language models on a pipeline x tensor x context x data grid."};
    app.require_subcommand(1);
    app.set_help_all_flag("--help-all", "Help for every subcommand");
    app.set_version_flag("--version", std::string("trident ") + TRIDENT_VERSION +
#if TRIDENT_HAVE_CUDA
                                          " (backends: cpu, cuda)"
#else
                                          " (backends: cpu; built without the CUDA toolkit)"
#endif
    );
    commands::TrainOptions train;
    commands::BenchOptions bench;
    commands::ExportOptions exp;
    commands::CheckpointInfoOptions info;
    commands::TokenizeOptions tok;
    commands::GenerateOptions gen;
    commands::ScheduleOptions sched;
    commands::PlanOptions plan;
    // In this order in the help.
    const CLI::App* train_cmd = add_train(app, train);
    const CLI::App* bench_cmd = add_bench(app, bench);
    const CLI::App* export_cmd = add_export(app, exp);
    const CLI::App* info_cmd = add_checkpoint_info(app, info);
    const CLI::App* tokenize_cmd = add_tokenize(app, tok);
    const CLI::App* generate_cmd = add_generate(app, gen);
    const CLI::App* schedule_cmd = add_schedule(app, sched);
    const CLI::App* plan_cmd = add_plan(app, plan);

    CLI11_PARSE(app, argc, argv);
    try {
        if (*train_cmd || *bench_cmd) {  // the commands that run on a grid of processes
            // First of all: a signal in a run's first second is answered as any later one.
            if (*train_cmd) train::install_preemption_handlers();
            parallel::World world(argc, argv);
            return *train_cmd ? commands::train(train, world) : commands::bench(bench, world);
        }
        if (*export_cmd) return commands::export_model(exp);
        if (*info_cmd) return commands::checkpoint_info(info);
        if (*tokenize_cmd) return commands::tokenize(tok);
        if (*generate_cmd) return commands::generate(gen);
        if (*schedule_cmd) return commands::schedule(sched);
        if (*plan_cmd) return commands::plan(plan);
    } catch (const std::filesystem::filesystem_error& e) {
        // A path the commands' own checks (io/user_paths.h) let through: said as they say
        // it, the path cut, rather than as the library's "filesystem error: ..." line.
        std::fprintf(stderr, "trident: error: '%s': %s\n", io::shown(e.path1().string()).c_str(),
                     io::errno_text(e.code().value()).c_str());
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "trident: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
