// Faults and how a run ends on each: the stall watchdog's report (in-process, with a stand-in
// for the abort), written files whose failures name the file and the errno, a checkpoint save
// on a full disk (the run stops cleanly with the previous checkpoint intact and loadable, or
// with checkpoint.on_error: continue saves again at the next interval), the metrics file and
// the trace on a failing disk, data that changed between a checkpoint and its resume, an
// allocation that fails, and the test faults' own settings. Multi-rank stalls, dead ranks
// and full disks under mpirun are in tests/mpi/test_faults.py, under Slurm in
// tests/slurm/test_local_cluster.py.
#include <sys/resource.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_support.h"
#include "io/fingerprint.h"
#include "io/output_file.h"
#include "kernels/error.h"
#include "parallel/watchdog.h"
#include "train/checkpoint_manifest.h"

using namespace cli;
using namespace trident;
namespace fs = std::filesystem;
using Catch::Contains;

namespace {

using namespace std::chrono_literals;

// A watchdog whose report is kept instead of aborting; the phase and step are reset after.
struct Watched {
    std::string report;
    std::mutex mutex;
    parallel::Watchdog dog;

    Watched(double timeout, double first_step, double checkpoint,
            parallel::GridShape grid = {1, 1, 2})
        : dog(parallel::WatchdogSettings{timeout, first_step, checkpoint, grid, 0,
                                         [this](const std::string& m) {
                                             std::lock_guard lock(mutex);
                                             report = m;
                                         }}) {}
    ~Watched() {
        parallel::set_step(0);
        parallel::set_microbatch(-1);
    }
    std::string seen() {
        std::lock_guard lock(mutex);
        return report;
    }
};

// The binary with `env` (VAR=value ...) in its environment: the test faults.
RunResult run_env(const std::string& env, const std::string& args) {
    return run_shell(env + " " + std::string(TRIDENT_BINARY) + " " + args);
}

RunResult checked(const std::string& args) {
    return require_ok(run(args));
}

// The names in a directory, less a checkpoint.dir's lock file.
std::vector<std::string> entries(const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir))
        if (e.path().filename() != ".lock") names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

}  // namespace

TEST_CASE("watchdog: a wait past the timeout is reported with its call, group, peer and step",
          "[faults]") {
    Watched w(0.2, 0, 0);
    parallel::first_step_done();
    const parallel::GroupLabel* data = parallel::make_group_label("data", {0, 1});
    parallel::set_step(3);
    const parallel::ScopedPhase phase(parallel::Phase::training);
    parallel::set_microbatch(1);
    {
        const parallel::Blocked blocked("all_reduce", data);
        for (int i = 0; i < 100 && w.seen().empty(); ++i) std::this_thread::sleep_for(20ms);
    }
    const std::string m = w.seen();
    CHECK_THAT(m, Contains("rank 0 (pp 0, tp 0, dp 0): stalled "));
    CHECK_THAT(m, Contains(" in all_reduce on the data group (ranks 0 (pp 0, tp 0, dp 0), "
                           "1 (pp 0, tp 0, dp 1)) at step 3, microbatch 2, waiting on rank 1 "
                           "(pp 0, tp 0, dp 1); training.collective_timeout is 0.2 s: aborting "
                           "the job"));
}

TEST_CASE("watchdog: a receive names its peer, and a long group is listed shortened", "[faults]") {
    Watched w(0.1, 0, 0, {1, 16, 1});
    parallel::first_step_done();
    std::vector<int> ranks(16);
    for (int r = 0; r < 16; ++r) ranks[static_cast<std::size_t>(r)] = r;
    const parallel::GroupLabel* tensor = parallel::make_group_label("tensor", ranks);
    {
        const parallel::Blocked blocked("recv", tensor, 9);
        for (int i = 0; i < 100 && w.seen().empty(); ++i) std::this_thread::sleep_for(20ms);
    }
    const std::string m = w.seen();
    CHECK_THAT(m, Contains("in recv on the tensor group (ranks 0 (pp 0, tp 0, dp 0), "));
    CHECK_THAT(m, Contains("5 (pp 0, tp 5, dp 0), ..., 15 (pp 0, tp 15, dp 0)) before the first "
                           "step, waiting on rank 9 (pp 0, tp 9, dp 0)"));
}

TEST_CASE("watchdog: short waits, time outside calls and other threads' waits are not stalls",
          "[faults]") {
    Watched w(0.2, 0, 0);
    parallel::first_step_done();
    const parallel::GroupLabel* data = parallel::make_group_label("data", {0, 1});
    for (int i = 0; i < 10; ++i) {  // 0.5 s in all, 50 ms per call
        const parallel::Blocked blocked("all_reduce", data);
        std::this_thread::sleep_for(50ms);
    }
    std::this_thread::sleep_for(400ms);  // computing, in no call
    std::thread([&] {
        const parallel::Blocked blocked("all_reduce", data);  // not the watched thread
        std::this_thread::sleep_for(400ms);
    }).join();
    CHECK(w.seen().empty());
}

TEST_CASE("watchdog: the first step and checkpoints have their own allowance", "[faults]") {
    const parallel::GroupLabel* world = parallel::make_group_label("world", {0, 1});
    {
        Watched w(0.1, 1.0, 0);
        {
            const parallel::Blocked blocked("barrier", world);
            std::this_thread::sleep_for(400ms);
        }
        CHECK(w.seen().empty());  // before the first step: 1 s
        parallel::first_step_done();
        {
            const parallel::ScopedPhase phase(parallel::Phase::checkpoint);
            const parallel::Blocked blocked("barrier", world);
            for (int i = 0; i < 50 && w.seen().empty(); ++i) std::this_thread::sleep_for(20ms);
        }
        // In a checkpoint without an allowance of its own: the plain timeout.
        CHECK_THAT(w.seen(), Contains("in a checkpoint save or load before the first step") &&
                                 Contains("training.collective_timeout is 0.1 s"));
    }
    {
        Watched w(0.1, 0, 1.0);
        parallel::first_step_done();
        parallel::set_step(7);
        {
            const parallel::ScopedPhase phase(parallel::Phase::checkpoint);
            const parallel::Blocked blocked("barrier", world);
            std::this_thread::sleep_for(400ms);
        }
        CHECK(w.seen().empty());
        {
            const parallel::Blocked blocked("barrier", world);
            for (int i = 0; i < 50 && w.seen().empty(); ++i) std::this_thread::sleep_for(20ms);
        }
        CHECK_THAT(w.seen(), Contains("after step 7, waiting on rank 1"));
    }
}

TEST_CASE("output files: a failed write is an error naming the file and the errno", "[faults]") {
    Workspace ws;
    // A file-size limit of 16 bytes (SIGXFSZ ignored): the write past it fails with EFBIG, as
    // one on a full disk fails with ENOSPC.
    struct rlimit before {};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &before) == 0);
    const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = before;
    small.rlim_cur = 16;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    io::OutputFile limited(ws.path("limited.txt"));
    std::string failure;
    try {
        limited.write(std::string(100, 'x'));
    } catch (const Error& e) {
        failure = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &before);
    std::signal(SIGXFSZ, old_handler);
    CHECK(failure == ws.path("limited.txt") + ": cannot write: File too large (EFBIG)");
    CHECK_THROWS_WITH(io::OutputFile("/no/such/dir/x"),
                      "/no/such/dir/x: cannot create: No such file or directory (ENOENT)");
    // A device is no file to write: refused, never fed.
    CHECK_THROWS_WITH(io::OutputFile("/dev/full", io::OutputFile::Mode::append),
                      "'/dev/full' exists and is a character device, not a regular file: it is "
                      "not written over; name a file");
}

TEST_CASE("fingerprints: size and sampled SHA-256 follow truncation and replacement", "[faults]") {
    Workspace ws;
    std::string big(3 << 20, 'x');
    for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 2654435761u >> 13);
    const std::string path = ws.write("big.bin", big);
    const io::Fingerprint before = io::fingerprint_file(path);
    CHECK(before.bytes == big.size());
    CHECK(io::fingerprint_file(path) == before);
    ws.write("big.bin", big.substr(0, big.size() - 1));
    CHECK(io::fingerprint_file(path).bytes == big.size() - 1);
    big.back() ^= 1;  // the last byte is always in the sample
    ws.write("big.bin", big);
    const io::Fingerprint edited = io::fingerprint_file(path);
    CHECK(edited.bytes == before.bytes);
    CHECK(edited.sampled_sha256 != before.sampled_sha256);
    CHECK_THROWS_WITH(io::fingerprint_file(ws.path("none.bin")), Contains("none.bin: cannot open"));
}

TEST_CASE("manifest: data files read back, and their changes are described", "[faults]") {
    using train::DataFileRecord;
    const std::vector<DataFileRecord> then = {{"data.train", "a.bin", 100, std::string(64, 'a')},
                                              {"data.train", "b.bin", 200, std::string(64, 'b')},
                                              {"data.valid", "v.bin", 50, std::string(64, 'v')}};
    CHECK(train::describe_data_changes(then, then).empty());
    auto now = then;
    now[0].bytes = 60;
    now[1].sampled_sha256 = std::string(64, 'c');
    now[2].path = "moved/v.bin";  // the same bytes elsewhere: no change
    CHECK(train::describe_data_changes(then, now) ==
          "data.train: a.bin: 60 bytes now, 100 then (truncated or replaced); data.train: b.bin: "
          "the same size, other contents (its sampled SHA-256 differs: replaced or edited)");
    CHECK(train::describe_data_changes(then, {then[0]}) == "data.train: 1 files now, 2 then");
    CHECK(train::describe_data_changes(then, {then[0], then[1]}).empty());  // no valid now

    Workspace ws;
    train::Manifest m;
    m.step = 4;
    m.shape = model::GptShape{64, 128, 16, 2, 32, 4, 64, 4};
    m.layout.schedule = "1f1b";
    m.layout.chunk_layers = {2};
    m.precision = "fp32";
    m.data = then;
    fs::create_directories(ws.path("step"));
    std::ofstream(ws.path("step/manifest.json")) << train::manifest_json(m);
    const train::Manifest back = train::read_manifest(ws.path("step"));
    CHECK(back.data_recorded);
    REQUIRE(back.data.size() == 3);
    CHECK(back.data[1].path == "b.bin");
    CHECK(back.data[1].bytes == 200);
    CHECK(back.data[2].key == "data.valid");
    CHECK(train::describe_data_changes(back.data, then).empty());
}

TEST_CASE("cli: a checkpoint save on a full disk stops the run cleanly, the one before intact",
          "[faults][cli]") {
    Workspace ws;
    const std::string ck = ws.path("ck");
    const std::string args =
        " --set training.steps=4 --set checkpoint.interval=1 --set "
        "checkpoint.dir=" +
        ck;
    // The shard of step 2's save fails half written.
    const RunResult r =
        run_env("TRIDENT_TEST_WRITE_ERROR=step_000002/pp0_tp0_dp0:ENOSPC", ws.train(args));
    require_clear_error(r, "checkpoint " + ck + "/step_000002 not saved: " + ck +
                               "/.tmp_step_000002/pp0_tp0_dp0.safetensors: cannot write: No space "
                               "left on device (ENOSPC); " +
                               ck +
                               "/step_000001 is the newest checkpoint, as it was "
                               "(checkpoint.on_error: stop)");
    CHECK(count_of(r.output, "trident: error:") == 1);
    CHECK(r.output.find("step     2/4") != std::string::npos);
    CHECK(r.output.find("step     3/4") == std::string::npos);  // stopped after step 2
    // Nothing half written; the metrics (logging.metrics' default) beside the checkpoints.
    CHECK(entries(ck) == std::vector<std::string>{"metrics.jsonl", "step_000001"});
    checked("checkpoint info " + ck + "/step_000001");
    // The run resumes from it and trains as the uninterrupted one.
    checked(ws.train(" --set training.steps=4 --set logging.metrics=" + ws.path("whole.jsonl")));
    checked(ws.train(args + " --set logging.metrics=" + ws.path("resumed.jsonl")));
    const auto whole = losses_of(ws.path("whole.jsonl"));
    CHECK(losses_of(ws.path("resumed.jsonl")) ==
          std::vector<std::string>(whole.begin() + 1, whole.end()));

    // The manifest, rank 0's last file, likewise.
    Workspace ws2;
    const RunResult m =
        run_env("TRIDENT_TEST_WRITE_ERROR=step_000002/manifest:EDQUOT",
                ws2.train(" --set training.steps=3 --set checkpoint.interval=1 --set "
                          "checkpoint.dir=" +
                          ws2.path("ck")));
    require_clear_error(m,
                        "/.tmp_step_000002/manifest.json: cannot write: Disk quota exceeded "
                        "(EDQUOT)");
    CHECK(entries(ws2.path("ck")) == std::vector<std::string>{"metrics.jsonl", "step_000001"});
}

TEST_CASE("cli: with checkpoint.on_error: continue a failed save is retried at the next interval",
          "[faults][cli]") {
    Workspace ws;
    const std::string ck = ws.path("ck");
    const std::string args =
        " --set training.steps=6 --set checkpoint.interval=2 --set "
        "checkpoint.on_error=continue --set checkpoint.dir=" +
        ck + " --set logging.metrics=" + ws.path("m.jsonl");
    const RunResult r =
        require_ok(run_env("TRIDENT_TEST_WRITE_ERROR=step_000004/pp0:EIO", ws.train(args)));
    CHECK_THAT(r.output,
               Contains("trident: warning: checkpoint " + ck + "/step_000004 not saved: ") &&
                   Contains("cannot write: Input/output error (EIO); " + ck +
                            "/step_000002 is the newest checkpoint, as it was; "
                            "training goes on and saves again at step 6"));
    CHECK(entries(ck) == std::vector<std::string>{"step_000002", "step_000006"});
    CHECK(losses_of(ws.path("m.jsonl")).size() == 6);
    checked("checkpoint info " + ck);

    // The last save has no later one to retry it: the run ends with the error.
    Workspace ws2;
    require_clear_error(
        run_env("TRIDENT_TEST_WRITE_ERROR=step_000004/pp0:EIO",
                ws2.train(" --set training.steps=4 --set checkpoint.interval=2 --set "
                          "checkpoint.on_error=continue --set checkpoint.dir=" +
                          ws2.path("ck"))),
        "/step_000004 not saved: ");
    CHECK(entries(ws2.path("ck")) == std::vector<std::string>{"metrics.jsonl", "step_000002"});
}

TEST_CASE("cli: a metrics file that cannot be written stops the run, or is passed over",
          "[faults][cli]") {
    Workspace ws;
    // Every write fails with ENOSPC, as on a full disk (/dev/full is refused: no regular file).
    const std::string metrics = ws.path("m.jsonl");
    const std::string full = "TRIDENT_TEST_WRITE_ERROR=m.jsonl:ENOSPC";
    const RunResult r =
        run_env(full, ws.train("--set training.steps=3 --set logging.metrics=" + metrics));
    require_clear_error(r, "logging.metrics: " + metrics +
                               ": cannot write: No space left on device (ENOSPC) "
                               "(logging.on_error: stop); checkpoint.dir is not set");
    CHECK(r.output.find("step     2/3") == std::string::npos);  // stopped after step 1

    const RunResult c = require_ok(run_env(full, ws.train("--set training.steps=3 --set "
                                                          "logging.on_error=continue --set "
                                                          "logging.metrics=" +
                                                          metrics)));
    CHECK(count_of(c.output, "trident: warning: logging.metrics: " + metrics + ": cannot write") ==
          3);
    CHECK(c.output.find("done: 3 steps") != std::string::npos);

    // A record cut off half written is taken back: the file holds whole lines only.
    const RunResult h =
        require_ok(run_env("TRIDENT_TEST_WRITE_ERROR=m.jsonl:ENOSPC:1",
                           ws.train("--set training.steps=3 --set logging.on_error=continue "
                                    "--set logging.metrics=" +
                                    metrics)));
    CHECK_THAT(h.output, Contains("step 1 is not in it"));
    std::ifstream in(metrics);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    REQUIRE(lines.size() == 2);
    CHECK(lines[0].rfind("{\"step\": 2, ", 0) == 0);
    CHECK(lines[1].rfind("{\"step\": 3, ", 0) == 0);
}

TEST_CASE("cli: a trace that cannot be written is an error, or a warning", "[faults][cli]") {
    Workspace ws;
    const std::string trace = ws.path("t/trace.json");
    const std::string args = "--set training.steps=3 --set logging.trace=" + trace;
    require_clear_error(run_env("TRIDENT_TEST_WRITE_ERROR=trace.json:EIO", ws.train(args)),
                        "logging.trace: " + trace +
                            ": cannot write: Input/output error (EIO) (logging.on_error: stop; "
                            "training itself is done)");
    CHECK(entries(ws.path("t")).empty());  // no part of it left behind
    const RunResult c = require_ok(run_env("TRIDENT_TEST_WRITE_ERROR=trace.json:EIO",
                                           ws.train(args + " --set logging.on_error=continue")));
    CHECK_THAT(c.output, Contains("trident: warning: logging.trace: ") &&
                             Contains("no trace (logging.on_error: continue)"));
    checked(ws.train(args));
    CHECK(fs::file_size(trace) > 0);
}

TEST_CASE("cli: data changed since the checkpoint stops the resume, naming the file",
          "[faults][cli]") {
    Workspace ws;
    const std::string ck =
        " --set checkpoint.dir=" + ws.path("ck") + " --set checkpoint.interval=2";
    checked(ws.train("--set training.steps=2" + ck));
    const std::string data = ws.path("train.bin");

    // Truncated: the shard rewritten with fewer tokens.
    std::vector<uint16_t> fewer(ws.tokens.begin(), ws.tokens.end() - 100);
    data::write_token_shard(data, fewer);
    const RunResult r = run(ws.train("--set training.steps=4" + ck));
    require_clear_error(r, "checkpoint.resume: the data changed since " + ws.path("ck") +
                               "/step_000002 was written: data.train: " + data + ": " +
                               std::to_string(1024 + 2 * fewer.size()) + " bytes now, " +
                               std::to_string(1024 + 2 * ws.tokens.size()) +
                               " then (truncated or replaced)");
    CHECK_THAT(r.output, Contains("checkpoint.allow_data_change: true"));

    // Replaced by other tokens of the same size.
    std::vector<uint16_t> other(ws.tokens);
    for (uint16_t& t : other) t = static_cast<uint16_t>((t + 1) % 64);
    data::write_token_shard(data, other);
    require_clear_error(run(ws.train("--set training.steps=4" + ck)),
                        data + ": the same size, other contents");

    // Said to be intended: a warning, and the run goes on.
    const RunResult allowed =
        checked(ws.train("--set training.steps=4 --set checkpoint.allow_data_change=true" + ck));
    CHECK_THAT(allowed.output, Contains("trident: warning: the data changed since") &&
                                   Contains("going on (checkpoint.allow_data_change: true)"));
    CHECK_THAT(allowed.output, Contains("done: 4 steps"));
}

TEST_CASE("cli: a failed allocation is reported as out of memory with where it happened",
          "[faults][cli]") {
    Workspace ws;
    require_clear_error(
        run_env("TRIDENT_TEST_FAIL_AT_STEP=2:0:oom", ws.train("--set training.steps=3")),
        "out of memory: an allocation failed (std::bad_alloc) at step 2");
    require_clear_error(run_env("TRIDENT_TEST_FAIL_AT_STEP=2:0:oops", ws.train()),
                        "TRIDENT_TEST_FAIL_AT_STEP: expected STEP:RANK:error|oom|kill (e.g. "
                        "3:1:oom), got '2:0:oops'");
    require_clear_error(run_env("TRIDENT_TEST_WRITE_ERROR=x:ENOTANERROR", ws.train()),
                        "TRIDENT_TEST_WRITE_ERROR: expected TEXT:ERRNO[:COUNT]");
}
