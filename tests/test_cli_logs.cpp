// What a run says before, during and after its steps: the device line whatever the device key,
// a llama's architecture and key/value heads, every output (TensorBoard's too), the loss a
// resumed run started from named by its step, a time left that a stall does not keep inflated,
// the grid's four dimensions in --help, one note for an override of a deprecated key, and a
// warning where a validation would count samples twice.
#include <catch2/catch.hpp>
#include <string>

#include "cli_support.h"
#include "train/metrics.h"

using namespace cli;
using Catch::Contains;

TEST_CASE("cli: the start-up lines name the device, the model and every output", "[cli][logs]") {
    Workspace ws;
    // device: cpu in the config says so, as auto does.
    const RunResult cpu = require_ok(run(ws.train("--set device=cpu --set training.steps=1")));
    CHECK(cpu.output.starts_with("device: cpu (the config's device: cpu)\n"));
    CHECK_THAT(cpu.output, Contains("\nmodel: gpt2, "));

    // A llama's architecture, key/value heads and own LM head; TensorBoard's directory.
    const RunResult llama = require_ok(
        run(ws.train("--set model.arch=llama --set model.kv_heads=2 --set training.steps=1 "
                     "--set logging.tensorboard=" +
                     ws.path("tb"))));
    CHECK_THAT(llama.output, Contains("\nmodel: llama, "));
    CHECK_THAT(llama.output, Contains(" | heads 4 | kv_heads 2 | ffn "));
    CHECK_THAT(llama.output, Contains(" | untied head\n"));
    CHECK_THAT(llama.output, Contains("| trace none | tensorboard " + ws.path("tb") + "\n"));

    CHECK_THAT(run("--help").output, Contains("pipeline x tensor x context x data grid"));
}

TEST_CASE("cli: a resumed run's last line names the step its first loss is at", "[cli][logs]") {
    Workspace ws;
    const std::string run_to =
        " --set checkpoint.dir=" + ws.path("ck") + " --set data.valid=" + ws.path("train.bin");
    CHECK_THAT(require_ok(run(ws.train(run_to + " --set training.steps=2"))).output,
               Contains(" before training)\n"));
    const RunResult resumed = require_ok(run(ws.train(run_to + " --set training.steps=3")));
    CHECK_THAT(resumed.output, Contains("(at resume)"));
    CHECK_THAT(resumed.output, Contains(" at step 2)\n"));
    CHECK(resumed.output.find("before training") == std::string::npos);
    // Its first step after the resume records where it went on from.
    std::ifstream in(ws.path("ck/metrics.jsonl"));
    std::string line, resumed_lines;
    while (std::getline(in, line))
        if (line.find("\"resumed_at\": 2,") != std::string::npos) resumed_lines += line;
    CHECK(resumed_lines.starts_with("{\"step\": 3, "));
}

TEST_CASE("cli: more validation sequences than data.valid's samples are warned of", "[cli][logs]") {
    Workspace ws;
    // 40 tokens of 16-token samples: 2 samples, fewer than the one global batch of 4.
    trident::data::write_token_shard(ws.path("small.bin"), std::vector<uint16_t>(40, 3));
    const RunResult r = require_ok(
        run(ws.train("--set training.steps=1 --set data.valid=" + ws.path("small.bin"))));
    CHECK_THAT(r.output,
               Contains("trident: warning: training.eval_sequences is 4 but data.valid holds 2 "
                        "samples: each validation counts some of them more than once; set it to "
                        "2 (a multiple of micro_batch x parallel.data) to count each once"));
    const RunResult fits = require_ok(
        run(ws.train("--set training.steps=1 --set training.eval_sequences=2 --set data.valid=" +
                     ws.path("small.bin"))));
    CHECK(fits.output.find("warning") == std::string::npos);
}

TEST_CASE("cli: --set of the new key over a file's deprecated one runs with one note",
          "[cli][logs]") {
    Workspace ws;
    const std::string file =
        ws.write("old2.yaml",
                 "model: {vocab_size: 64, seq_len: 16, layers: 2, hidden: 32, "
                 "heads: 4, ffn_hidden: 64}\n"
                 "training: {micro_batch: 2, global_batch: 4, steps: 1, threads: 1, "
                 "eval_batches: 2}\n"
                 "data: {train: " +
                     ws.path("train.bin") + ", valid: " + ws.path("train.bin") + "}\n");
    const RunResult r =
        require_ok(run("train --config " + file + " --set training.eval_sequences=2"));
    CHECK(count_of(r.output, "trident: note: ") == 1);
    CHECK_THAT(r.output, Contains("trident: note: --set training.eval_sequences=2 replaces the "
                                  "deprecated training.eval_batches of " +
                                  file + ":2"));
    CHECK(r.output.find("warning") == std::string::npos);
    CHECK_THAT(r.output, Contains("| 2 sequences per validation"));
}

TEST_CASE("metrics: the time left follows the recent steps, and a stall passes", "[logs]") {
    trident::train::StepTimes times;
    CHECK(times.seconds_left(10) == 0);
    for (int i = 0; i < 30; ++i) times.add(1.0);
    CHECK(times.seconds_left(100) == 100);
    times.add(600);  // one stalled step: the median of the window does not move
    CHECK(times.seconds_left(100) == 100);
    // The machine slows down for good: within half a window the estimate follows.
    for (int i = 0; i < 11; ++i) times.add(2.0);
    CHECK(times.seconds_left(100) == 200);
    // Two middle values are averaged.
    trident::train::StepTimes two;
    two.add(1.0);
    two.add(3.0);
    CHECK(two.seconds_left(10) == 20);
}
