// Command-line tests of what a run leaves and says: one metrics file per run (beside its
// checkpoints, resumed only where it ends at the checkpoint's step), where the output goes,
// an MFU above 100% never shown as a plain figure, and the base checkpoint of low-rank
// adapters (recorded relative to them, kept from its run's rotation, shown by checkpoint info).
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_support.h"

using namespace cli;
using Catch::Contains;

namespace {

// The "step" of each line of a metrics file, in order.
std::vector<int> steps_of(const std::string& metrics) {
    std::ifstream in(metrics);
    std::vector<int> steps;
    for (std::string line; std::getline(in, line);)
        steps.push_back(std::stoi(line.substr(line.find("\"step\": ") + 8)));
    return steps;
}

std::string text_of(const std::string& path) {
    std::ifstream in(path);
    return {std::istreambuf_iterator<char>(in), {}};
}

}  // namespace

TEST_CASE("cli: a run's metrics go beside its checkpoints and a resume continues them",
          "[cli][metrics]") {
    Workspace ws;
    const std::string ck = ws.path("ck"), metrics = ws.path("ck/metrics.jsonl");
    const std::string valid = " --set data.valid=" + ws.path("train.bin");
    const std::string run_to = " --set checkpoint.interval=2 --set checkpoint.dir=" + ck + valid;
    const RunResult first = require_ok(run(ws.train(run_to + " --set training.steps=4")));
    CHECK_THAT(first.output, Contains("output: checkpoints " + ck +
                                      " every 2 steps and at the end, newest 3 kept | metrics " +
                                      metrics + " | trace none | tensorboard none\n"));
    // The validation before training is step 0 of the file, a line of its own.
    REQUIRE(steps_of(metrics) == std::vector<int>{0, 1, 2, 3, 4});
    CHECK(text_of(metrics).starts_with("{\"step\": 0, \"val_loss\": "));

    // Resumed at its last step (4), the file goes on.
    require_ok(run(ws.train(run_to + " --set training.steps=6")));
    CHECK(steps_of(metrics) == std::vector<int>{0, 1, 2, 3, 4, 5, 6});
    const std::string whole = text_of(metrics);

    // A run that went on past its last checkpoint (steps 7 and 8 after step 6's): resumed at
    // 6, the file is cut back there and steps 7 and 8 are run again, as an unbroken run has.
    std::ofstream(metrics, std::ios::app) << "{\"step\": 7, \"loss\": 1}\n{\"step\": 8, \"lo";
    const RunResult cut = require_ok(run(ws.train(run_to + " --set training.steps=8")));
    CHECK_THAT(cut.output, Contains("metrics: " + metrics +
                                    " went on to step 7; cut back to step 6, the checkpoint's"));
    CHECK(steps_of(metrics) == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8});
    CHECK(text_of(metrics).starts_with(whole));
    CHECK(text_of(metrics).find("\"loss\": 1}") == std::string::npos);

    // Another run's file (it ends at step 2) is refused, untouched, before any step.
    const std::string other = ws.write("other.jsonl",
                                       "{\"step\": 1, \"loss\": 5}\n"
                                       "{\"step\": 2, \"loss\": 4}\n");
    require_clear_error(
        run(ws.train(run_to + " --set training.steps=9 --set logging.metrics=" + other)),
        "logging.metrics: " + other +
            " ends at step 2 but this run resumes at step 8: it holds another run's steps. Set "
            "logging.metrics to another file, or move this one away");
    CHECK(steps_of(other) == std::vector<int>{1, 2});
    CHECK(steps_of(metrics).back() == 8);
}

TEST_CASE("cli: an MFU above 100% says the peak is unreliable, and hardware.peak_flops sets it",
          "[cli][metrics]") {
    Workspace ws;
    // A peak far below any machine's: every step is above it.
    const RunResult low = require_ok(run(ws.train("--set hardware.peak_flops=1000")));
    CHECK_THAT(low.output,
               Contains("peak: 0.0 GFLOP/s (hardware.peak_flops; MFU is against this)"));
    CHECK_THAT(low.output, Contains("% (above 100%: the peak is unreliable) | "));
    CHECK(count_of(low.output, "note: an MFU above 100% means") == 1);
    // Below the peak nothing is said (whether the measured one is, depends on the machine's
    // load: only its source is checked).
    const RunResult high = require_ok(run(ws.train("--set hardware.peak_flops=1e18")));
    CHECK(high.output.find("unreliable") == std::string::npos);
    CHECK(high.output.find("note:") == std::string::npos);
    const RunResult measured = require_ok(run(ws.train()));
    CHECK_THAT(measured.output, Contains("(fp32 GEMM measured at start-up, best of several"));
    const RunResult bench = require_ok(run("bench --config " + ws.path("tiny.yaml") +
                                           " --steps 1 --warmup 0 --set "
                                           "hardware.peak_flops=1000"));
    CHECK_THAT(bench.output,
               Contains("is above 100%: the peak measured at start-up is unreliable"));
    CHECK_THAT(bench.output, Contains("\"peak_reliable\": false"));
}

TEST_CASE("cli: the base checkpoint of adapters is recorded relative to them and kept",
          "[cli][lora]") {
    Workspace ws;
    const std::string base = ws.path("base"), adapters = ws.path("adapters");
    const std::string base_run =
        " --set checkpoint.interval=1 --set checkpoint.keep=1 --set checkpoint.dir=" + base;
    require_ok(run(ws.train(base_run + " --set training.steps=2")));
    require_ok(run(ws.train("--set model.init_from=" + base + " --set training.lora.rank=2 " +
                            "--set checkpoint.dir=" + adapters)));
    const RunResult info = require_ok(run("checkpoint info " + adapters));
    CHECK_THAT(info.output, Contains("lora: rank 2 | alpha 16 (scale 8) | targets qkv, "
                                     "attn_proj, fc, fc_proj\n"));
    CHECK_THAT(info.output, Contains("lora base: " + base +
                                     "/step_000002 (recorded as "
                                     "../../base/step_000002) | sha256 "));
    CHECK_THAT(info.output, Contains("…  ok\n"));
    CHECK_THAT(require_ok(run("checkpoint info " + base)).output,
               Contains("kept as the base of the adapters of " + adapters));

    // The base run goes on with keep 1: its step 2 stays, as the adapters' base.
    const RunResult more = require_ok(run(ws.train(base_run + " --set training.steps=4")));
    CHECK(fs::exists(base + "/step_000002"));
    CHECK_FALSE(fs::exists(base + "/step_000003"));
    CHECK(fs::exists(base + "/step_000004"));

    // Moved with it, the adapters still find their base.
    const std::string moved = ws.path("moved");
    fs::create_directories(moved);
    fs::rename(base, moved + "/base");
    fs::rename(adapters, moved + "/adapters");
    require_ok(run("export --checkpoint " + moved + "/adapters --merge-lora --output " +
                   ws.path("merged.safetensors")));
    // Without it the adapters are unusable, and checkpoint info says so.
    fs::remove_all(moved + "/base/step_000002");
    const RunResult lost = run("checkpoint info " + moved + "/adapters");
    require_clear_error(lost,
                        "the adapters' base weights " + moved + "/base/step_000002 are MISSING");
}

TEST_CASE("cli: counts of one read in the singular, and --version names the build", "[cli]") {
    Workspace ws;
    // One step of one microbatch of 2 sequences on one rank.
    const RunResult one = require_ok(run(ws.train(
        "--set training.steps=1 --set training.global_batch=2 --set training.micro_batch=2")));
    CHECK_THAT(one.output, Contains("= 1 rank | backend cpu"));
    CHECK_THAT(one.output, Contains("batch: 2 sequences = 32 tokens per step | micro batch 2 | "
                                    "1 microbatch per replica |"));
    CHECK_THAT(one.output, Contains("(ZeRO stage 1 over 1 replica)"));
    CHECK_THAT(one.output, Contains("done: 1 step\n"));
    const RunResult plan = require_ok(run("plan --config " + ws.path("tiny.yaml") +
                                          " --set training.global_batch=1 --set "
                                          "training.micro_batch=1"));
    CHECK_THAT(plan.output, Contains("step: 1 sequence (16 tokens) | micro batch 1 | 1 "
                                     "microbatch per replica"));
    const RunResult version = require_ok(run("--version"));
    CHECK_THAT(version.output, Contains("trident 0.1.0 (backends: cpu"));
}
