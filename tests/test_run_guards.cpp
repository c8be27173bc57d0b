// Command-line tests of what a run finds at start-up rather than later: an unwritable or
// shared checkpoint.dir, a model too large for the machine, a special file where a regular
// one belongs, and a resume that changes its run. Each must give one clear line, promptly
// (the commands run under `timeout`, so a hang fails the test instead of stalling it).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cli_support.h"
#include "kernels/source_path.h"

using namespace cli;
namespace fs = std::filesystem;

TEST_CASE("run guards: an unwritable checkpoint.dir stops the run before step 1",
          "[cli][bad-input]") {
    Workspace ws;
    ws.write("a_file", "x");
    for (const auto& [dir, why] :
         {std::pair{ws.path("a_file"), "is not a directory"},
          std::pair{ws.path("a_file") + "/ck", "cannot be made a directory"},
          std::pair{std::string("/proc/trident_ck"), "cannot be made a directory"}}) {
        const RunResult r = run_bounded(ws.train("--set checkpoint.dir=" + dir));
        require_clear_error(r, "checkpoint.dir: '" + dir + "' " + why);
        CHECK_FALSE(contains(r.output, "step     1/"));  // found before any training
    }
}

TEST_CASE("run guards: a second run on one checkpoint.dir is refused, naming the holder",
          "[cli][bad-input]") {
    Workspace ws;
    const std::string ck = ws.path("ck");
    // The first run trains for long, in the background; the second starts once it has
    // finished a step (a SIGTERM before step 1 would leave nothing to save).
    Spawned first(ws.train("--set checkpoint.dir=" + ck + " --set training.steps=10000000"),
                  ws.path("first.log"));
    REQUIRE(first.said("step     1/"));
    const RunResult second = run_bounded(ws.train("--set checkpoint.dir=" + ck));
    const std::string log = first.stopped_by(SIGTERM, "step     1/");  // it saves and ends
    INFO(log);
    CHECK(contains(log, "trident: preempted by SIGTERM"));
    require_clear_error(second, "checkpoint.dir: '" + ck + "' is in use by another run (host ");
    CHECK(contains(second.output, "pid " + std::to_string(first.pid) + ")"));
    // The first run's checkpoint, written as it ended, is whole; the lock went with it.
    const RunResult info = run_bounded("checkpoint info " + ck);
    INFO(info.output);
    CHECK(info.exit_code == 0);
    const RunResult third =
        run_bounded(ws.train("--set checkpoint.dir=" + ck + " --set training.steps=1"));
    INFO(third.output);
    CHECK(third.exit_code == 0);
    CHECK(contains(third.output, "done: the checkpoint is at step "));
}

TEST_CASE("run guards: a model that cannot fit this machine's memory is refused in one line",
          "[cli][bad-input]") {
    Workspace ws;
    // 4096 layers of hidden 16384 (ffn 64): 4.4 T parameters, 82 TiB of model states.
    const RunResult r = run_bounded(
        ws.train("--set model.layers=4096 --set model.hidden=16384 --set model.heads=16"));
    require_clear_error(r, "model: 4407.24 B parameters need at least 82091.28 GiB of ");
    CHECK(contains(r.output, "of weights, gradients and optimizer state per rank"));
    CHECK(contains(r.output, "of memory: use a smaller model, or more ranks and machines"));
    // A count past the limits never gets that far: refused as the config is read.
    require_clear_error(run_bounded(ws.train("--set model.layers=1e9")),
                        "model.layers: must be in [1, 4096], got 1000000000");
    // A sequence longer than the data: the too-few-tokens message, with seq_len + 1 exact.
    require_clear_error(run_bounded(ws.train("--set model.seq_len=1048576")),
                        "tokens are too few for one sample of model.seq_len + 1 = 1048577 tokens");
}

TEST_CASE("run guards: a FIFO or a device where a file belongs is refused, never waited on",
          "[cli][bad-input]") {
    Workspace ws;
    const std::string fifo = ws.path("fifo");
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    require_clear_error(run_bounded("train --config " + fifo),
                        "config file " + fifo + ": not a regular file (a FIFO)");
    require_clear_error(run_bounded("train --config /dev/zero"),
                        "config file /dev/zero: not a regular file (a character device)");
    require_clear_error(run_bounded(ws.train("--set data.train=" + fifo)),
                        fifo + ": not a regular file (a FIFO)");

    // A checkpoint whose manifest.json, then its config.yaml, is a FIFO: resume, info and
    // export refuse it.
    REQUIRE(run_bounded(ws.train("--set checkpoint.dir=" + ws.path("ck"))).exit_code == 0);
    const fs::path step = fs::path(ws.path("ck")) / "step_000003";
    for (const char* name : {"manifest.json", "config.yaml"}) {
        fs::rename(step / name, step / (std::string(name) + ".real"));
        REQUIRE(::mkfifo((step / name).c_str(), 0600) == 0);
        const std::string where = (step / name).string() + ": not a regular file (a FIFO)";
        const RunResult info = run_bounded("checkpoint info " + step.string());
        // info lists each file's state: the config among them.
        require_clear_error(
            info, std::string(name) == "manifest.json" ? where : "1 of 2 files fail their check");
        if (std::string(name) == "config.yaml") CHECK(contains(info.output, "NOT A REGULAR FILE"));
        require_clear_error(
            run_bounded("export --checkpoint " + step.string() + " --output " + ws.path("w")),
            where);
        require_clear_error(run_bounded(ws.train("--set checkpoint.resume=" + step.string())),
                            where);
        fs::remove(step / name);
        fs::rename(step / (std::string(name) + ".real"), step / name);
    }
    // A LoRA run whose base weights are a FIFO, or /dev/zero.
    for (const std::string& base : {fifo, std::string("/dev/zero")})
        require_clear_error(
            run_bounded(ws.train("--set model.init_from=" + base + " --set training.lora.rank=2")),
            base + ": not a regular file");
}

TEST_CASE("run guards: a resume that changes the seed or the batch is refused, naming it",
          "[cli][bad-input]") {
    Workspace ws;
    const std::string ck = "--set checkpoint.dir=" + ws.path("ck");
    REQUIRE(run_bounded(ws.train(ck + " --set checkpoint.interval=1 --set checkpoint.keep=5"))
                .exit_code == 0);
    const std::string from = " --set checkpoint.resume=" + ws.path("ck") + "/step_000001";
    require_clear_error(run_bounded(ws.train(ck + from + " --set training.seed=7")),
                        "training.seed: 1234 in the checkpoint's run, 7 now; resuming would draw "
                        "other samples than the run planned");
    require_clear_error(
        run_bounded(ws.train(ck + from + " --set training.global_batch=8")),
        "training.global_batch: 4 in the checkpoint's run, 8 now; resuming would draw other");
    // checkpoint.allow_order_change makes it a warning; a longer run says that the schedule
    // changes; the first save (step 2) replaces step 2 and deletes step 3: said.
    const RunResult r = run_bounded(ws.train(ck + from +
                                             " --set training.seed=7 --set training.steps=6 "
                                             "--set checkpoint.interval=1 "
                                             "--set checkpoint.allow_order_change=true"));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(contains(r.output,
                   "trident: warning: checkpoint.resume: training.seed: 1234 in the "
                   "checkpoint's run, 7 now; going on"));
    CHECK(contains(r.output,
                   "trident: warning: checkpoint.resume: training.steps is 6, the checkpoint's "
                   "run had 3: the learning rate's decay, laid out over training.steps, is "
                   "reshaped from step 1 on"));
    CHECK(contains(r.output, "the run's first save, at step 2, deletes 2 later checkpoint(s) of " +
                                 ws.path("ck") + " (" + ws.path("ck") + "/step_000002 to " +
                                 ws.path("ck") + "/step_000003)"));
}

namespace {

// A long run in the background on `data`, once it has finished a step; its log is run.log.
std::unique_ptr<Spawned> start_long_run(const Workspace& ws, const std::string& data) {
    auto run = std::make_unique<Spawned>(
        ws.train("--set data.train=" + data + " --set training.steps=100000000"),
        ws.path("run.log"));
    REQUIRE(run->said("step     1/"));
    return run;
}

}  // namespace

TEST_CASE("run guards: a data file truncated under a run ends it with one line naming it",
          "[cli][bad-input]") {
    Workspace ws;
    fs::copy_file(ws.path("train.bin"), ws.path("data.bin"));
    const auto run = start_long_run(ws, ws.path("data.bin"));
    std::ofstream(ws.path("data.bin"), std::ios::trunc).close();  // rewritten in place
    REQUIRE(run->ended());
    const std::string log = run->output();
    INFO(log);
    CHECK(contains(log, "trident: error: data.train: " + ws.path("data.bin") +
                            ": the file changed while this run read it (truncated or rewritten "
                            "in place"));
    CHECK_FALSE(contains(log, "Bus error"));
}

TEST_CASE("run guards: tokenize replaces its output whole, never pulling it from under a run",
          "[cli][tokenize]") {
    Workspace ws;
    // Bytes below the tiny model's vocabulary of 64.
    const std::string text = ws.write("t.txt", std::string(5000, '5'));
    const std::string out = ws.path("data.bin");
    const std::string tokenize = "tokenize --tokenizer bytes --no-progress --output " + out + " ";
    REQUIRE(run_bounded(tokenize + text).exit_code == 0);
    // A run maps the file; tokenizing into it again gives a new file, the run's stays whole.
    const auto run = start_long_run(ws, out);
    struct stat before {};
    REQUIRE(::stat(out.c_str(), &before) == 0);
    REQUIRE(run_bounded(tokenize + ws.write("u.txt", std::string(100, '7'))).exit_code == 0);
    struct stat after {};
    REQUIRE(::stat(out.c_str(), &after) == 0);
    CHECK(after.st_ino != before.st_ino);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    CHECK_FALSE(run->ended(0));  // still training on the old file
    CHECK(contains(run->stopped_by(SIGTERM, "step     1/"), "trident: preempted by SIGTERM"));
    // A write that fails (the disk full) names the file and the errno and leaves the old
    // file as it was, with no temporary file beside it.
    const RunResult failed = run_shell("TRIDENT_TEST_WRITE_ERROR=data.bin:ENOSPC timeout 60 " +
                                       std::string(TRIDENT_BINARY) + " " + tokenize + text);
    require_clear_error(failed, out + ": cannot write: No space left on device (ENOSPC)");
    CHECK(fs::file_size(out) == 256 * 4 + 100 * 2);
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(ws.dir))
        if (e.path().filename().string().rfind("data.bin", 0) == 0)
            names.push_back(e.path().filename().string());
    CHECK(names == std::vector<std::string>{"data.bin"});
}

TEST_CASE("run guards: messages cite source files by their path in the repository", "[cli]") {
    using trident::source_path;
    CHECK(std::string(source_path("../kernels/cpu/cpu_ops.cpp")) == "kernels/cpu/cpu_ops.cpp");
    CHECK(std::string(source_path("/work/x/src/parallel/cuda/nccl_comm.cpp")) ==
          "src/parallel/cuda/nccl_comm.cpp");
    CHECK(std::string(source_path("/home/data/y/kernels/cuda/gemm.cpp")) ==
          "kernels/cuda/gemm.cpp");
    CHECK(std::string(source_path("model/gpt.cpp")) == "model/gpt.cpp");
    // This file as the build names it: the tests/ directory is none of the four.
    CHECK(std::string(source_path(__FILE__)) == __FILE__);
}
