// Faults under a running `trident train` and in what it leaves: a dataset rewritten in place
// with the same size (every batch's ids are checked as read), an impossible loss (a bad
// step), two runs on one metrics file, checkpoint.dir removed under a run, a flipped byte in a
// checkpoint (resume and `checkpoint info` agree), an edited manifest or config.yaml (corrupt,
// the previous checkpoint resumed), and signals: SIGTERM during the start-up, Ctrl-C once
// (saved; said unsaved without checkpoint.dir) and twice (aborted). Runs are spawned with SIGINT at
// its default, as a terminal's foreground job has it, and reaped here for their exit status.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "cli_support.h"
#include "config/config.h"
#include "train/checkpoint_manifest.h"
#include "train/step_guard.h"

using namespace cli;
using namespace trident;
namespace fs = std::filesystem;

namespace {

// A checkpoint's shard with one byte flipped in the data of the first tensor whose name starts
// with `prefix` (param/, master/, ...).
void flip_byte(const std::string& shard, const std::string& prefix) {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header = 0;
    f.read(reinterpret_cast<char*>(&header), 8);
    std::string json(header, ' ');
    f.read(json.data(), static_cast<std::streamsize>(header));
    const std::size_t name = json.find("\"" + prefix);
    REQUIRE(name != std::string::npos);
    const std::size_t offsets = json.find("\"data_offsets\":[", name) + 16;
    const uint64_t begin = std::stoull(json.substr(offsets));
    f.seekg(static_cast<std::streamoff>(8 + header + begin + 1));
    char byte = 0;
    f.read(&byte, 1);
    byte ^= 0x10;
    f.seekp(static_cast<std::streamoff>(8 + header + begin + 1));
    f.write(&byte, 1);
}

void replace_text(const std::string& path, const std::string& from, const std::string& to) {
    std::string text = read_text(path);
    const std::size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    std::ofstream(path, std::ios::binary) << text.replace(at, from.size(), to);
}

}  // namespace

TEST_CASE("run faults: a dataset rewritten in place with the same size stops the run at once",
          "[faults][cli]") {
    Workspace ws;
    for (const bool megatron : {false, true}) {
        INFO((megatron ? "Megatron" : "llm.c shard"));
        const std::string data = megatron ? ws.write_megatron("mega") : ws.path("data.bin");
        if (!megatron)
            fs::copy_file(ws.path("train.bin"), data, fs::copy_options::overwrite_existing);
        const std::string bin = megatron ? data + ".bin" : data;
        const std::string metrics = ws.path(megatron ? "mm.jsonl" : "m.jsonl");
        Spawned run(ws.train("--set data.train=" + data + " --set training.steps=100000000 " +
                             "--set logging.metrics=" + metrics),
                    ws.path(megatron ? "megatron.log" : "shard.log"));
        REQUIRE(run.said("step     1/"));
        // Every token byte 0xFF, in place: the size, and so the size/mtime-free fingerprint's
        // first check, unchanged; the header too for the shard (read only at open).
        const uintmax_t size = fs::file_size(bin);
        {
            std::fstream f(bin, std::ios::in | std::ios::out | std::ios::binary);
            const std::string ff(size, '\xff');
            f.write(ff.data(), static_cast<std::streamsize>(size));
        }
        REQUIRE(fs::file_size(bin) == size);
        REQUIRE(run.ended());
        const std::string log = run.output();
        INFO(log);
        CHECK(run.exit_code() == 1);
        CHECK(contains(log, "trident: error: data.train: " + bin + ": token id 65535 at byte "));
        CHECK(contains(log,
                       "is outside the vocabulary (model.vocab_size = 64); it was inside "
                       "when the run opened the file, so the file changed while this run "
                       "read it"));
        CHECK(count_of(log, "trident: error:") == 1);
    }
}

TEST_CASE("run faults: a negative loss is a bad step, skipped or stopped as a non-finite one",
          "[faults][training]") {
    config::TrainingConfig t;
    t.nonfinite = config::NonFinite::skip;
    t.max_skipped = 0;
    train::StepGuard skip(t);
    int asked = 0;
    const auto sighting = [&] {
        ++asked;
        return std::string();
    };
    const train::Verdict v = skip.judge(5, -20909.0, 1.0, sighting);
    CHECK_FALSE(v.apply);
    CHECK(v.reason == "impossible_loss");
    CHECK(v.note ==
          "step 5: the loss -20909 is negative, which a cross-entropy cannot be (token "
          "ids or weights out of bounds); the update is skipped on every rank (1 in a "
          "row; training.max_skipped: 0)");
    CHECK(asked == 0);                               // no rank saw a non-finite value to look for
    CHECK(skip.judge(6, 0.0, 1.0, sighting).apply);  // a perfect fit is possible
    t.nonfinite = config::NonFinite::stop;
    train::StepGuard stop(t);
    CHECK_THROWS_AS(stop.judge(7, -1e-3, 1.0, sighting), train::TrainingStopped);
}

TEST_CASE("run faults: two runs on one metrics file are refused, and a replaced file is said",
          "[faults][cli]") {
    Workspace ws;
    const std::string metrics = ws.path("m.jsonl");
    Spawned first(ws.train("--set training.steps=100000000 --set logging.metrics=" + metrics),
                  ws.path("first.log"));
    REQUIRE(first.said("step     1/"));
    const RunResult second = run(ws.train("--set logging.metrics=" + metrics));
    ::kill(first.pid, SIGTERM);
    REQUIRE(first.ended());
    require_clear_error(second, "logging.metrics: '" + metrics +
                                    "' is being written by another run (it holds the file's lock)");
    CHECK_FALSE(contains(second.output, "step     1/"));
    // The first run's file whole: every line a step record.
    const std::string held = read_text(metrics);
    CHECK(count_of(held, "{\"step\": ") == count_of(held, "\n"));
    // A fresh run replaces it, and says so.
    const RunResult third = require_ok(run(ws.train("--set logging.metrics=" + metrics)));
    CHECK(contains(third.output, "metrics: " + metrics + " held " + std::to_string(held.size()) +
                                     " bytes of an earlier run; replaced by this run's"));
    CHECK(count_of(read_text(metrics), "\n") == 3);
}

TEST_CASE("run faults: checkpoint.dir removed under a run stops it at the next save",
          "[faults][cli]") {
    Workspace ws;
    const std::string ck = ws.path("ck");
    // Steps of 100 ms: the directory goes after step 1, the first save is at step 4.
    Spawned run(ws.train("--set checkpoint.dir=" + ck + " --set checkpoint.interval=4 " +
                         "--set training.steps=8 --set logging.metrics=" + ws.path("m.jsonl")),
                ws.path("run.log"), "TRIDENT_TEST_SLOW_RANK=0:100");
    REQUIRE(run.said("step     1/"));
    fs::remove_all(ck);
    REQUIRE(run.ended());
    const std::string log = run.output();
    INFO(log);
    CHECK(run.exit_code() == 1);
    CHECK(contains(log, "trident: error: checkpoint.dir: '" + ck +
                            "' was removed or replaced during the run (its lock file is gone"));
    CHECK(contains(log, "training stopped after step 4 without saving"));
    CHECK_FALSE(fs::exists(ck));
}

TEST_CASE("run faults: a flipped byte in a checkpoint: resume and checkpoint info agree",
          "[faults][cli]") {
    Workspace ws;
    const std::string ck = ws.path("ck");
    const std::string save = " --set checkpoint.dir=" + ck + " --set checkpoint.interval=1";
    require_ok(run(ws.train(save)));
    // In param/ (the weights in training precision, which no resume reads): usable, said.
    flip_byte(ck + "/step_000003/pp0_tp0_dp0.safetensors", "param/");
    const RunResult info = run("checkpoint info " + ck + "/step_000003");
    INFO(info.output);
    CHECK(info.exit_code == 0);
    CHECK(contains(info.output, "DAMAGED param/"));
    CHECK(contains(info.output, "warning: pp0_tp0_dp0.safetensors: param/"));
    CHECK(contains(info.output, "the checkpoint is usable"));
    const RunResult resumed = require_ok(run(ws.train(save + " --set training.steps=4")));
    CHECK(contains(resumed.output, "resumed: " + ck + "/step_000003 at step 3"));
    // In master/ (what a resume reads): corrupt to both; the resume takes the one before.
    flip_byte(ck + "/step_000004/pp0_tp0_dp0.safetensors", "master/");
    require_clear_error(run("checkpoint info " + ck + "/step_000004"), "1 of 2 files fail");
    const RunResult fallback = require_ok(run(ws.train(save + " --set training.steps=5")));
    CHECK(contains(fallback.output,
                   "checkpoint: " + ck + "/step_000004 is unusable, trying the one before it: "));
    CHECK(contains(fallback.output, "resumed: " + ck + "/step_000003 at step 3"));
}

TEST_CASE("run faults: an edited manifest or config.yaml is a corrupt checkpoint",
          "[faults][cli]") {
    Workspace ws;
    const std::string ck = ws.path("ck");
    const std::string save = " --set checkpoint.dir=" + ck + " --set checkpoint.interval=1 " +
                             "--set checkpoint.keep=10 --set training.steps=6";
    require_ok(run(ws.train(save)));
    replace_text(ck + "/step_000006/manifest.json", "\"step\": 6,", "\"step\": 7,");
    const std::string corrupt = ck +
                                "/step_000006/manifest.json: its own SHA-256 (\"manifest_sha256\") "
                                "does not match its contents: edited or corrupt";
    require_clear_error(run("checkpoint info " + ck + "/step_000006"), corrupt);
    const RunResult r = require_ok(run(ws.train(save + " --set training.steps=7")));
    CHECK(contains(r.output, "checkpoint: " + ck +
                                 "/step_000006 is unusable, trying the one "
                                 "before it: " +
                                 corrupt));
    CHECK(contains(r.output, "resumed: " + ck + "/step_000005 at step 5"));
    // The seed in a checkpoint's config.yaml, edited to another of the same length.
    replace_text(ck + "/step_000007/config.yaml", "seed: 1234", "seed: 4321");
    const RunResult c = require_ok(run(ws.train(save + " --set training.steps=8")));
    CHECK(contains(c.output, ck + "/step_000007/config.yaml: SHA-256 does not match the manifest: "
                                  "edited or corrupt"));
    CHECK_FALSE(contains(c.output, "training.seed"));
    CHECK(contains(c.output, "resumed: " + ck + "/step_000006 at step 6"));
}

TEST_CASE("run faults: SIGTERM during the start-up or a resume ends the run with one line",
          "[faults][cli]") {
    Workspace ws;
    const std::string ck = ws.path("ck");
    require_ok(run(ws.train("--set checkpoint.dir=" + ck)));
    for (const bool resuming : {false, true}) {
        INFO((resuming ? "resuming" : "fresh"));
        // The signal as soon as the run has said anything (its config read): before the
        // trainer, the resume and the first step.
        Spawned r(ws.train("--set training.steps=6" +
                           (resuming ? " --set checkpoint.dir=" + ck : std::string())),
                  ws.path(resuming ? "resume.log" : "fresh.log"));
        const std::string log = r.stopped_by(SIGTERM, "device: ");
        INFO(log);
        CHECK(r.exit_code() == 0);
        CHECK(contains(log, "trident: preempted by SIGTERM (15) before step " +
                                std::string(resuming ? "4" : "1") +
                                " of 6: nothing trained, nothing to save; "));
        CHECK_FALSE(contains(log, "step     4/"));
        if (resuming) CHECK(contains(log, ck + "/step_000003 is the newest checkpoint, as it was"));
    }
}

TEST_CASE("run faults: Ctrl-C once saves after the step and exits, twice aborts", "[faults][cli]") {
    Workspace ws;
    const std::string ck = ws.path("ck");
    const std::string args = ws.train("--set training.steps=100000000 --set checkpoint.dir=" + ck);
    {
        Spawned r(args, ws.path("once.log"));
        const std::string log = r.stopped_by(SIGINT, "step     1/");
        INFO(log);
        CHECK(r.exit_code() == 130);
        CHECK(contains(log,
                       "trident: Ctrl-C: stopping after the step under way, with a "
                       "checkpoint; press Ctrl-C again to abort without saving"));
        CHECK(contains(log, "trident: preempted by SIGINT (2) after step "));
        CHECK(contains(log, "checkpoint written to " + ck + "/step_"));
        require_ok(run("checkpoint info " + ck));
    }
    {
        // Without checkpoint.dir the stop is the same, and says that nothing is saved.
        Spawned r(ws.train("--set training.steps=100000000"), ws.path("unsaved.log"));
        const std::string log = r.stopped_by(SIGINT, "step     1/");
        INFO(log);
        CHECK(r.exit_code() == 130);
        CHECK(contains(log,
                       "trident: Ctrl-C: stopping after the step under way (checkpoint.dir is "
                       "not set: nothing is saved); press Ctrl-C again to abort at once"));
        CHECK(contains(log, "no checkpoint written (checkpoint.dir is not set)"));
    }
    // Steps of a second: the second Ctrl-C comes while the first waits for the step to end.
    fs::remove_all(ck);
    Spawned r(args, ws.path("twice.log"), "TRIDENT_TEST_SLOW_RANK=0:1000");
    REQUIRE(r.said("step     1/"));
    ::kill(r.pid, SIGINT);
    const std::string log = r.stopped_by(SIGINT, "press Ctrl-C again");
    INFO(log);
    CHECK(WIFSIGNALED(r.status));
    CHECK(WTERMSIG(r.status) == SIGINT);
    CHECK(contains(log, "trident: a second Ctrl-C: aborted without saving"));
    CHECK(train::list_checkpoints(ck).empty());
}
