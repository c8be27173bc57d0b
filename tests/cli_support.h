// What the command-line tests share: running the built `trident` binary (to its end, or in the
// background), and a scratch workspace holding a tiny model's config and data.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "data/megatron_dataset.h"
#include "data/token_shards.h"
#include "kernels/random.h"

namespace cli {

namespace fs = std::filesystem;

struct RunResult {
    int exit_code;
    std::string output;  // stdout and stderr together
};

// Runs a shell command line (e.g. the binary under mpirun).
inline RunResult run_shell(const std::string& command) {
    const std::string cmd = command + " 2>&1";
    FILE* pipe = popen(cmd.c_str(), "r");
    REQUIRE(pipe != nullptr);
    std::string output;
    std::array<char, 4096> buf{};
    while (std::fgets(buf.data(), buf.size(), pipe)) output += buf.data();
    const int status = pclose(pipe);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

// The binary under test and the source tree (configs/, data/): where the build put them, or,
// for a build carried to another machine (scripts/gpu_verify.sh), where TRIDENT_TEST_BINARY and
// TRIDENT_TEST_SOURCE_DIR say.
inline std::string binary() {
    const char* carried = std::getenv("TRIDENT_TEST_BINARY");
    return carried ? carried : TRIDENT_BINARY;
}
inline std::string source_dir() {
    const char* carried = std::getenv("TRIDENT_TEST_SOURCE_DIR");
    return carried ? carried : TRIDENT_SOURCE_DIR;
}

inline RunResult run(const std::string& args) {
    // The GPT-2 files as setup fetched them into the source tree, wherever the build is.
    return run_shell("TRIDENT_TOKENIZER_DIR=${TRIDENT_TOKENIZER_DIR:-" + source_dir() +
                     "/data/gpt2} " + binary() + " " + args);
}

// A command that must not hang: ended by `timeout` after 60 s (exit code 124).
inline RunResult run_bounded(const std::string& args) {
    return run_shell("TRIDENT_TOKENIZER_DIR=" + source_dir() + "/data/gpt2 timeout 60 " + binary() +
                     " " + args);
}

inline bool contains(const std::string& text, const std::string& what) {
    return text.find(what) != std::string::npos;
}

// A scratch directory with a tiny model's config and data, removed afterwards.
struct Workspace {
    fs::path dir;
    std::vector<uint16_t> tokens;  // of train.bin

    Workspace() {
        dir = fs::temp_directory_path() /
              ("trident_cli_" + std::to_string(::getpid()) + "_" + std::to_string(unique_id()));
        fs::create_directories(dir);
        tokens.resize(2000);
        for (std::size_t i = 0; i < tokens.size(); ++i)
            tokens[i] = static_cast<uint16_t>(trident::kernels::hash64(7, i) % 64);
        trident::data::write_token_shard((dir / "train.bin").string(), tokens);
        write("tiny.yaml", tiny_config());
    }
    ~Workspace() { fs::remove_all(dir); }

    static int unique_id() {
        static int n = 0;
        return ++n;
    }

    std::string tiny_config() const {
        return "model: {vocab_size: 64, seq_len: 16, layers: 2, hidden: 32, heads: 4, "
               "ffn_hidden: 64}\n"
               "training: {micro_batch: 2, global_batch: 4, steps: 3, warmup_steps: 1, "
               "threads: 1}\n"
               "data: {train: " +
               (dir / "train.bin").string() + "}\n";
    }

    std::string path(const std::string& name) const { return (dir / name).string(); }

    // train.bin's tokens as a Megatron dataset PREFIX, in documents of 1 to 300 tokens.
    std::string write_megatron(const std::string& prefix) const {
        trident::data::MegatronWriter writer(path(prefix));
        for (std::size_t at = 0, n = 1; at < tokens.size(); at += n, n = n * 7 % 300 + 1)
            writer.add_document(std::span(tokens).subspan(at, std::min(n, tokens.size() - at)));
        writer.finish();
        return path(prefix);
    }

    std::string write(const std::string& name, const std::string& text) const {
        std::ofstream(dir / name) << text;
        return path(name);
    }

    std::string write_bytes(const std::string& name, const std::vector<char>& bytes) const {
        std::ofstream out(dir / name, std::ios::binary);
        out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
        return path(name);
    }

    std::vector<char> read_bytes(const std::string& name) const {
        std::ifstream in(dir / name, std::ios::binary);
        return {std::istreambuf_iterator<char>(in), {}};
    }

    std::string train(const std::string& extra = "") const {
        return "train --config " + path("tiny.yaml") + " " + extra;
    }
};

// A file's whole text (a log, a config).
inline std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}

// `trident ARGS` in the background, its output in `log`, with `env` (VAR=value ...) and
// SIGINT at its default; ended (SIGKILL) and reaped if the test leaves it running.
struct Spawned {
    pid_t pid = -1;
    int status = -1;
    std::string log;

    Spawned(const std::string& args, std::string log_path, const std::string& env = "")
        : log(std::move(log_path)) {
        const std::string command = "exec env TRIDENT_TOKENIZER_DIR=" + source_dir() +
                                    "/data/gpt2 " + env + " " + binary() + " " + args + " > " +
                                    log + " 2>&1";
        pid = ::fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            ::signal(SIGINT, SIG_DFL);
            ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
            ::_exit(127);
        }
    }
    ~Spawned() {
        if (status == -1) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, &status, 0);
        }
    }
    // Waits at most `seconds` for the end; whether it came.
    bool ended(double seconds = 60) {
        for (auto start = std::chrono::steady_clock::now();
             std::chrono::steady_clock::now() - start < std::chrono::duration<double>(seconds);
             std::this_thread::sleep_for(std::chrono::milliseconds(5)))
            if (::waitpid(pid, &status, WNOHANG) == pid) return true;
        return false;
    }
    // Waits until the log holds `text` (polled every millisecond, at most a minute).
    bool said(const std::string& text) {
        for (int i = 0; i < 60000; ++i, std::this_thread::sleep_for(std::chrono::milliseconds(1)))
            if (contains(read_text(log), text)) return true;
        return false;
    }
    // Sends `signal` once the log holds `text`, and waits for the end; the output.
    std::string stopped_by(int signal, const std::string& text) {
        REQUIRE(said(text));
        ::kill(pid, signal);
        REQUIRE(ended());
        return output();
    }
    int exit_code() const { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }
    std::string output() const { return read_text(log); }
};

// Every token of a dataset's stream, in order.
inline std::vector<int32_t> read_all(const trident::data::TokenStream& stream) {
    std::vector<int32_t> ids(stream.size());
    stream.read(0, ids);
    return ids;
}

// The ids of `text` under the bytes tokenizer: its bytes.
inline std::vector<int32_t> bytes_of(const std::string& text) {
    return std::vector<int32_t>(text.begin(), text.end());
}

// Checks a run that succeeded, and hands it on.
inline RunResult require_ok(const RunResult& r) {
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    return r;
}

// How many times `what` occurs in `text`.
inline int count_of(const std::string& text, const std::string& what) {
    int n = 0;
    for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
        ++n;
    return n;
}

// Checks a failed run: exit 1 and one "trident: error:" line that contains `expected`.
inline void require_clear_error(const RunResult& r, const std::string& expected) {
    INFO(r.output);
    REQUIRE(r.exit_code == 1);
    REQUIRE(r.output.find("trident: error: ") != std::string::npos);
    REQUIRE(r.output.find(expected) != std::string::npos);
}

// The "loss" field of each step's line of a metrics file, as written (compared as text:
// bitwise). The validation before training, step 0, has none.
inline std::vector<std::string> losses_of(const std::string& metrics_path) {
    std::ifstream in(metrics_path);
    std::vector<std::string> losses;
    for (std::string line; std::getline(in, line);) {
        if (line.starts_with("{\"step\": 0, \"val_loss\": ")) continue;
        const auto at = line.find("\"loss\": ");
        REQUIRE(at != std::string::npos);
        losses.push_back(line.substr(at, line.find(',', at) - at));
    }
    return losses;
}

}  // namespace cli
