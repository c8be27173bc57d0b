// Command-line tests of the paths a user gives (io/user_paths.h): every writer refuses an
// existing target that is not a regular file (a device node made with mknod here, never a real
// /dev node; a FIFO; a directory) before any work, and leaves it as it was; the trace's
// directory is probed at start-up; a path too long for the system, or one the file system
// cannot look up, is one line naming the option or key, the value cut. Each command runs under
// `timeout`: a FIFO opened for writing would otherwise hang the test.
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "cli_support.h"

using namespace cli;
namespace fs = std::filesystem;

namespace {

// A character device node of /dev/null's numbers at `path` (the tests run as root).
std::string make_null_node(const std::string& path) {
    REQUIRE(::mknod(path.c_str(), S_IFCHR | 0666, ::makedev(1, 3)) == 0);
    return path;
}

bool is_char_device(const std::string& path) {
    struct stat st {};
    return ::lstat(path.c_str(), &st) == 0 && S_ISCHR(st.st_mode);
}

// A refused output: one line naming `what` and the path as `kind`, and the node untouched.
void require_refused(const RunResult& r, const std::string& what, const std::string& path,
                     const std::string& kind) {
    require_clear_error(r, what + ": '" + path + "' exists and is " + kind +
                               ", not a regular file: it is not written over");
    CHECK(count_of(r.output, "trident: error:") == 1);
    CHECK_FALSE(contains(r.output, "step     1/"));  // found before any training
}

}  // namespace

TEST_CASE("output paths: export refuses a device node or a FIFO at --output, writing nothing",
          "[cli][bad-input]") {
    Workspace ws;
    REQUIRE(run_bounded(ws.train("--set checkpoint.dir=" + ws.path("ck"))).exit_code == 0);
    const std::string node = make_null_node(ws.path("null_node"));
    require_refused(run_bounded("export --checkpoint " + ws.path("ck") + " --output " + node),
                    "--output", node, "a character device");
    CHECK(is_char_device(node));
    CHECK_FALSE(fs::exists(ws.path("config.json")));  // nothing written beside it either
    const std::string fifo = ws.path("fifo");
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    require_refused(run_bounded("export --checkpoint " + ws.path("ck") + " --output " + fifo),
                    "--output", fifo, "a FIFO");
    // A config.json beside the output that is a device: refused alike.
    fs::create_directories(ws.path("out"));
    make_null_node(ws.path("out/config.json"));
    require_refused(run_bounded("export --checkpoint " + ws.path("ck") + " --output " +
                                ws.path("out/model.safetensors")),
                    "--output", ws.path("out/config.json"), "a character device");
    CHECK_FALSE(fs::exists(ws.path("out/model.safetensors")));
    // --format hf: a device where the folder goes.
    require_clear_error(
        run_bounded("export --format hf --checkpoint " + ws.path("ck") + " --output " + node),
        "--output: " + node + " exists and is not an empty folder");
    CHECK(is_char_device(node));
}

TEST_CASE("output paths: the trace, the metrics and TensorBoard refuse devices and FIFOs",
          "[cli][bad-input]") {
    Workspace ws;
    const std::string node = make_null_node(ws.path("null_node"));
    const std::string fifo = ws.path("fifo");
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    require_refused(run_bounded(ws.train("--set logging.trace=" + node)), "logging.trace", node,
                    "a character device");
    require_refused(run_bounded(ws.train("--set logging.metrics=" + node)), "logging.metrics", node,
                    "a character device");
    require_refused(run_bounded(ws.train("--set logging.metrics=" + fifo)), "logging.metrics", fifo,
                    "a FIFO");
    // The metrics' default beside the checkpoints.
    fs::create_directories(ws.path("ck"));
    make_null_node(ws.path("ck/metrics.jsonl"));
    require_refused(run_bounded(ws.train("--set checkpoint.dir=" + ws.path("ck"))),
                    "logging.metrics", ws.path("ck/metrics.jsonl"), "a character device");
    // TensorBoard's is a directory: a device there is no directory.
    const RunResult tb = run_bounded(ws.train("--set logging.tensorboard=" + node));
    require_clear_error(tb, "logging.tensorboard: '" + node + "' is not a directory");
    CHECK_FALSE(contains(tb.output, "step     1/"));
    CHECK(is_char_device(node));
    CHECK(fs::is_fifo(fifo));
}

TEST_CASE("output paths: tokenize refuses a device where its .bin or .idx goes",
          "[cli][bad-input][tokenize]") {
    Workspace ws;
    const std::string text = ws.write("t.txt", std::string(300, '5'));
    const std::string node = make_null_node(ws.path("data.bin"));
    const std::string tokenize = "tokenize --tokenizer bytes --no-progress ";
    require_refused(run_bounded(tokenize + "--output " + node + " " + text), "--output", node,
                    "a character device");
    CHECK(is_char_device(node));
    const std::string idx = make_null_node(ws.path("mega.idx"));
    require_refused(
        run_bounded(tokenize + "--format megatron --output " + ws.path("mega") + " " + text),
        "--output", idx, "a character device");
    CHECK(is_char_device(idx));
    CHECK_FALSE(fs::exists(ws.path("mega.bin")));
}

TEST_CASE("output paths: checkpoint.dir's entries and the offload files are never replaced",
          "[cli][bad-input]") {
    Workspace ws;
    // A device where step 3's directory would go: the save would have removed it.
    fs::create_directories(ws.path("ck"));
    const std::string step = make_null_node(ws.path("ck/step_000003"));
    const RunResult r = run_bounded(ws.train("--set checkpoint.dir=" + ws.path("ck")));
    require_clear_error(r, "checkpoint.dir: '" + step +
                               "' is a character device, not a checkpoint's directory: a save "
                               "would remove it");
    CHECK_FALSE(contains(r.output, "step     1/"));
    CHECK(is_char_device(step));
    fs::remove(step);
    // The lock file a FIFO.
    REQUIRE(::mkfifo(ws.path("ck/.lock").c_str(), 0600) == 0);
    require_refused(run_bounded(ws.train("--set checkpoint.dir=" + ws.path("ck"))),
                    "checkpoint.dir", ws.path("ck/.lock"), "a FIFO");
    // optimizer.offload: nvme's state file, then ZeRO-3's parameter shard: devices.
    fs::create_directories(ws.path("off"));
    const std::string nvme =
        "--set optimizer.offload=nvme --set optimizer.offload_dir=" + ws.path("off") + " ";
    const std::string state = make_null_node(ws.path("off/optimizer_state.rank0"));
    require_clear_error(run_bounded(ws.train(nvme)),
                        state + " exists and is a character device, not a regular file");
    CHECK(is_char_device(state));
    fs::remove(state);
    const std::string shard = make_null_node(ws.path("off/param_shard.rank0"));
    require_clear_error(
        run_bounded(
            ws.train(nvme + "--set parallel.zero_stage=3 --set optimizer.offload_params=true")),
        shard + " exists and is a character device, not a regular file");
    CHECK(is_char_device(shard));
}

TEST_CASE("output paths: schedule --svg refuses a device node", "[cli][bad-input]") {
    Workspace ws;
    const std::string node = make_null_node(ws.path("null_node"));
    require_refused(run_bounded("schedule --pipeline 2 --microbatches 2 --svg " + node), "--svg",
                    node, "a character device");
    CHECK(is_char_device(node));
    REQUIRE(
        run_bounded("schedule --pipeline 2 --microbatches 2 --svg " + ws.path("s.svg")).exit_code ==
        0);
    CHECK(fs::file_size(ws.path("s.svg")) > 0);
}

TEST_CASE("output paths: a trace that cannot be written is found at start-up, not at the end",
          "[cli][bad-input]") {
    Workspace ws;
    ws.write("a_file", "x");
    // A read-only file system (a tmpfs mounted so: root writes any directory otherwise).
    struct ReadOnlyMount {
        std::string dir;
        int code;
        explicit ReadOnlyMount(const std::string& at)
            : dir((fs::create_directories(at), at)),
              code(run_shell("mount -t tmpfs -o ro,size=64k tmpfs " + at).exit_code) {}
        ~ReadOnlyMount() {
            if (code == 0) run_shell("umount " + dir);
        }
    } mount(ws.path("ro"));
    REQUIRE(mount.code == 0);
    const std::string& ro = mount.dir;
    const std::vector<std::pair<std::string, std::string>> cases = {
        {ro + "/trace.json", "logging.trace: '" + ro + "' is not writable: "},
        {ws.path("a_file") + "/trace.json",
         "logging.trace: '" + ws.path("a_file") + "' is not a directory"},
        {"/proc/trident_trace/trace.json",
         "logging.trace: '/proc/trident_trace' cannot be made a directory"}};
    for (const auto& [trace, message] : cases) {
        const RunResult r = run_bounded(ws.train("--set logging.trace=" + trace));
        require_clear_error(r, message);
        CHECK_FALSE(contains(r.output, "step     1/"));
    }
}

TEST_CASE("output paths: a 10 MB path in the config is one line naming its key, the value cut",
          "[cli][bad-input]") {
    Workspace ws;
    const std::string huge(10 << 20, 'a');
    for (const std::string key : {"data.train", "checkpoint.dir"}) {
        std::string config = ws.tiny_config();
        if (key == "data.train")
            config.replace(config.find(ws.path("train.bin")), ws.path("train.bin").size(), huge);
        else
            config += "checkpoint: {dir: " + huge + "}\n";
        ws.write("huge.yaml", config);
        const RunResult r = run_bounded("train --config " + ws.path("huge.yaml"));
        // Asked first: a report of 10 MB of output would take the test minutes to print.
        INFO(r.output.substr(0, 1000));
        REQUIRE(r.output.size() < 1000);
        require_clear_error(r, key +
                                   ": a path of 10485760 characters, more than the 4095 a path "
                                   "may have: 'aaaa");
    }
}

TEST_CASE("output paths: a path too long, or that cannot be looked up, is one line naming its key",
          "[cli][bad-input]") {
    Workspace ws;
    REQUIRE(run_bounded(ws.train("--set checkpoint.dir=" + ws.path("ck"))).exit_code == 0);
    // Names too long for the file system, and a loop of symbolic links.
    const std::string name(300, 'b');
    fs::create_symlink("loop_b", ws.path("loop_a"));
    fs::create_symlink("loop_a", ws.path("loop_b"));
    const std::string loop = ws.path("loop_a") + "/x";
    const std::string too_long =
        "' holds a name of 300 characters, more than the 255 a file "
        "name may have";
    const std::string looped =
        "': cannot read its status: Too many levels of symbolic links "
        "(ELOOP)";
    struct Case {
        std::string args, key, problem;
    };
    const std::vector<Case> cases = {
        {"generate --weights " + name, "--weights", too_long},
        {"generate --checkpoint " + loop, "--checkpoint", looped},
        {"export --checkpoint " + name + " --output " + ws.path("w"), "--checkpoint", too_long},
        {"export --checkpoint " + ws.path("ck") + " --output " + ws.path(name), "--output",
         too_long},
        {"export --checkpoint " + ws.path("ck") + " --output /proc/trident_x/w.safetensors",
         "--output", "/proc/trident_x' cannot be made a directory"},
        {"tokenize --tokenizer bytes --no-progress --output /proc/trident_x/t.bin " +
             ws.write("t.txt", "text"),
         "--output", "/proc/trident_x' cannot be made a directory"},
        {"checkpoint info " + loop, "checkpoint info", looped},
        {ws.train("--set model.init_from=" + name), "model.init_from", too_long},
        {ws.train("--set model.init_from=" + loop), "model.init_from", looped},
        {ws.train("--set checkpoint.resume=" + name), "checkpoint.resume", too_long},
        {ws.train("--set checkpoint.resume=" + loop), "checkpoint.resume", looped}};
    for (const Case& c : cases) {
        const RunResult r = run_bounded(c.args);
        INFO(c.args.substr(0, 80));
        require_clear_error(r, c.key + ": '");
        CHECK(contains(r.output, c.problem));
        CHECK_FALSE(contains(r.output, "filesystem error"));
        CHECK(count_of(r.output, "trident: error:") == 1);
    }
}
