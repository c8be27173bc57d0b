// Command-line tests of numbers and files a careless user may give: thread counts far beyond
// the cores (bounded, with one line), schedule sizes and costs that would grow without bound,
// planner rates that are not finite (in a plan and in its search), a missing tokenizer for the
// sample after training (found at start-up), a global batch larger than an epoch (warned), and
// weights that cannot be what their config.json says or that hold a NaN (refused by generate).
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>

#include "cli_support.h"

using namespace cli;
namespace fs = std::filesystem;

namespace {

// The tiny model trained and exported as WS/w.safetensors (config.json beside it).
std::string exported(const Workspace& ws) {
    REQUIRE(run_bounded(ws.train("--set checkpoint.dir=" + ws.path("ck"))).exit_code == 0);
    REQUIRE(run_bounded("export --checkpoint " + ws.path("ck") + " --output " +
                        ws.path("w.safetensors"))
                .exit_code == 0);
    return ws.path("w.safetensors");
}

}  // namespace

TEST_CASE("input bounds: thread counts beyond 4 per core are cut, with one line",
          "[cli][bad-input]") {
    Workspace ws;
    const RunResult r = require_ok(run_bounded(ws.train("--set training.threads=100000")));
    CHECK(contains(r.output,
                   "trident: warning: training.threads: 100000 threads is more than 4 "
                   "per core this process may use ("));
    CHECK(contains(r.output, "done: 3 steps"));
    const std::string weights = exported(ws);
    const RunResult g =
        require_ok(run_bounded("generate --weights " + weights + " --threads 100000 -n 4"));
    CHECK(contains(g.output, "trident: warning: --threads: 100000 threads is more than 4"));
    const RunResult t = require_ok(
        run_bounded("tokenize --tokenizer bytes --no-progress --threads 100000 --output " +
                    ws.path("t.bin") + " " + ws.write("t.txt", "some text")));
    CHECK(contains(t.output, "trident: warning: --threads: 100000 threads is more than 4"));
    const RunResult j = require_ok(
        run_bounded("tokenize --tokenizer bytes --no-progress --threads 100000 --output " +
                    ws.path("j.bin") + " " + ws.write("j.jsonl", "{\"text\": \"some text\"}\n")));
    CHECK(contains(j.output, "trident: warning: --threads: 100000 threads is more than 4"));
    CHECK(contains(j.output, "of JSON lines (1 document of 1 file"));
}

TEST_CASE("input bounds: schedule sizes and costs past what it draws are one line",
          "[cli][bad-input]") {
    const std::pair<std::string, std::string> cases[] = {
        {"--pipeline 65536 --microbatches 100000000", "--pipeline must be in [1, 1024], got 65536"},
        {"--kind zb-v --pipeline 512 --microbatches 100000",
         "--microbatches must be in [1, 65536], got 100000"},
        {"--kind zb-v --pipeline 512 --microbatches 1000",
         "--pipeline x --virtual x --microbatches: 512 x 2 x 1000 chunk passes, more than the "
         "65536 this command draws"},
        {"--latency 1e9", "the timeline would take "},
        {"--forward-cost nan", "--forward-cost must be a finite number >= 0, got nan"},
        {"--backward-cost inf", "--backward-cost must be a finite number >= 0, got inf"}};
    for (const auto& [args, message] : cases) {
        INFO(args);
        require_clear_error(run_bounded("schedule --svg '' " + args), message);
    }
    // At the bound it still draws, promptly (the command's `timeout` would fail it).
    require_ok(run_bounded("schedule --svg '' --kind zb-v --pipeline 64 --microbatches 512"));
}

TEST_CASE("input bounds: plan refuses rates that are not finite", "[cli][bad-input][plan]") {
    Workspace ws;
    for (const std::string mode : {"", "--search --gpus 4 "}) {
        const std::string plan = "plan --config " + ws.path("tiny.yaml") + " " + mode;
        for (const std::string given :
             {"--hardware dgx-a100 --gemm-tflops nan", "--hardware dgx-a100 --gemm-tflops inf",
              "--gemm-tflops nan --mem-bw 1 --intra-bw 1 --inter-bw 1",
              "--hardware dgx-a100 --mem-bw inf"}) {
            INFO(mode << given);
            const RunResult r = run_bounded(plan + given);
            require_clear_error(r, ": expected a finite positive figure, got ");
            CHECK_FALSE(contains(r.output, "nan s per step"));
        }
        INFO(mode);
        require_clear_error(run_bounded(plan + "--hardware dgx-a100 --latency-us nan"),
                            "--latency-us: expected a finite number, got nan");
        require_clear_error(run_bounded(plan + "--hardware dgx-a100 --device-memory inf"),
                            "--device-memory: expected");
    }
}

TEST_CASE("input bounds: a missing tokenizer for the sample after training is found at start-up",
          "[cli][bad-input]") {
    Workspace ws;
    const RunResult r = run_shell(
        "TRIDENT_TOKENIZER_DIR=" + ws.path("no_tokenizer") + " timeout 60 " + binary() + " " +
        ws.train("--set logging.sample_tokens=4 --set checkpoint.dir=" + ws.path("ck")));
    require_clear_error(r,
                        "logging.sample_tokens: the sample after training needs the tokenizer: ");
    CHECK(contains(r.output, ws.path("no_tokenizer")));
    CHECK_FALSE(contains(r.output, "step     1/"));
    CHECK_FALSE(fs::exists(ws.path("ck/step_000003")));
}

TEST_CASE("input bounds: a step longer than an epoch of the data is warned of",
          "[cli][bad-input]") {
    Workspace ws;
    // 2000 tokens in windows of 16 + 1: 124 samples an epoch; a step of 256 reads 2.1 epochs.
    const RunResult r =
        require_ok(run_bounded(ws.train("--set training.global_batch=256 --set training.steps=1")));
    CHECK(contains(r.output,
                   "trident: warning: training.global_batch: 256 sequences a step is "
                   "2.1 epochs of data.train (124 samples): each step reads every "
                   "sample more than once"));
    CHECK_FALSE(contains(require_ok(run_bounded(ws.train())).output, "epochs of data.train"));
}

TEST_CASE("input bounds: generate refuses a config.json that says another shape than the weights",
          "[cli][bad-input]") {
    Workspace ws;
    const std::string weights = exported(ws);
    require_ok(run_bounded("generate --weights " + weights + " -n 2"));
    // config.json says 12 layers and a width of 768 beside weights of 2 and 32.
    const std::string config = ws.path("config.json");
    const std::vector<char> read = ws.read_bytes("config.json");
    std::string text(read.begin(), read.end());
    text.replace(text.find("\"n_layer\": 2"), 12, "\"n_layer\": 12");
    ws.write("config.json", text);
    require_clear_error(run_bounded("generate --weights " + weights + " -n 2"),
                        config +
                            ": n_layer is 12, but the weights beside it hold 2: it describes "
                            "another model");
}

TEST_CASE("input bounds: generate refuses weights that hold a NaN", "[cli][bad-input]") {
    Workspace ws;
    const std::string weights = exported(ws);
    // A NaN in the first value of the data (every tensor is F32).
    std::vector<char> bytes = ws.read_bytes("w.safetensors");
    uint64_t header = 0;
    std::memcpy(&header, bytes.data(), 8);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(bytes.data() + 8 + header, &nan, sizeof nan);
    ws.write_bytes("w.safetensors", bytes);
    require_clear_error(run_bounded("generate --weights " + weights + " -n 2"),
                        weights + ": tensor ");
    CHECK(contains(run_bounded("generate --weights " + weights + " -n 2").output,
                   "holds a non-finite value (nan at element 0): no text can be generated"));
}
