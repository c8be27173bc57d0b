// Command-line tests of the built `trident` binary: every kind of bad input gets one clear
// message and a non-zero exit; good runs are reproducible; export writes loadable weights.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_support.h"
#include "data/token_shards.h"

using namespace cli;
namespace fs = std::filesystem;

TEST_CASE("cli: help explains every subcommand", "[cli]") {
    for (const char* cmd : {"train", "bench", "export", "tokenize"}) {
        const RunResult r = run(std::string(cmd) + " --help");
        INFO(r.output);
        REQUIRE(r.exit_code == 0);
        REQUIRE(r.output.find("--") != std::string::npos);
    }
    REQUIRE(run("train --help").output.find("--set") != std::string::npos);
    REQUIRE(run("").exit_code != 0);
}

TEST_CASE("cli: a tiny run trains and writes metrics", "[cli]") {
    Workspace ws;
    const RunResult r = run(ws.train("--set logging.metrics=" + ws.path("m.jsonl")));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    REQUIRE(r.output.find("step     3/3") != std::string::npos);
    std::ifstream in(ws.path("m.jsonl"));
    std::string line;
    int lines = 0;
    while (std::getline(in, line)) {
        ++lines;
        for (const char* key : {"\"step\"", "\"loss\"", "\"lr\"", "\"grad_norm\"",
                                "\"tokens_per_s\"", "\"tflops_per_gpu\"", "\"mfu\"", "\"skipped\""})
            REQUIRE(line.find(key) != std::string::npos);
    }
    REQUIRE(lines == 3);
}

TEST_CASE("cli: bench runs on random tokens, with no data.train", "[cli]") {
    Workspace ws;
    const std::string no_data =
        ws.write("bench.yaml",
                 "model: {vocab_size: 64, seq_len: 16, layers: 2, hidden: 32, heads: 4}\n"
                 "training: {micro_batch: 2, global_batch: 4, threads: 1}\n");
    const RunResult r = run("bench --config " + no_data + " --steps 2 --warmup 1");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(r.output.find("bench step 2 |") != std::string::npos);
    CHECK(r.output.find("{\"tokens_per_s\": ") != std::string::npos);
    // Training reads data, so the same config is refused there.
    require_clear_error(run("train --config " + no_data), "data.train: required key missing");
}

TEST_CASE("cli: an error comes after the lines printed before it in one log", "[cli]") {
    // stdout and stderr in one pipe, as in a batch job's log: stdout is not a terminal there,
    // so without line buffering its lines would arrive after the error that ended the run.
    Workspace ws;
    const RunResult r = run("bench --config " + ws.path("tiny.yaml") +
                            " --steps 3 --set training.lr=1e30 --set training.warmup_steps=0"
                            " --set training.grad_clip=0");
    INFO(r.output);
    REQUIRE(r.exit_code == 1);
    const std::size_t step = r.output.find("warm-up step 1 |");
    const std::size_t error = r.output.find("trident: error: step 2: ");
    REQUIRE(step != std::string::npos);
    REQUIRE(error != std::string::npos);
    CHECK(step < error);
}

TEST_CASE("cli: two runs of one config give bitwise-identical losses", "[cli]") {
    Workspace ws;
    for (const char* shuffle : {"true", "false"}) {
        const std::string common = std::string("--set data.shuffle=") + shuffle +
                                   " --set model.dropout=0.1 --set training.threads=2";
        REQUIRE(run(ws.train(common + " --set logging.metrics=" + ws.path("a.jsonl"))).exit_code ==
                0);
        REQUIRE(run(ws.train(common + " --set logging.metrics=" + ws.path("b.jsonl"))).exit_code ==
                0);
        const auto a = losses_of(ws.path("a.jsonl"));
        REQUIRE(a.size() == 3);
        REQUIRE(a == losses_of(ws.path("b.jsonl")));
    }
}

TEST_CASE("cli: bad configs are named by file, line and key", "[cli][bad-input]") {
    Workspace ws;
    SECTION("malformed YAML") {
        const auto p = ws.write("bad.yaml", "model:\n  layers: [1, 2\n");
        require_clear_error(run("train --config " + p), "bad.yaml:");
    }
    SECTION("unknown key") {
        const auto p = ws.write("bad.yaml", ws.tiny_config() + "logging: {intervall: 3}\n");
        require_clear_error(run("train --config " + p), "logging.intervall");
    }
    SECTION("wrong type in an override") {
        require_clear_error(run(ws.train("--set training.lr=fast")), "training.lr");
    }
    SECTION("inconsistent batch") {
        require_clear_error(run(ws.train("--set training.global_batch=5")),
                            "training.global_batch");
    }
    SECTION("impossible grid") {
        require_clear_error(run(ws.train("--set parallel.tensor=2")), "1 process was started");
        require_clear_error(run(ws.train("--set parallel.data=2")), "1 × 1 × 2 = 2");
    }
    SECTION("missing config file") {
        require_clear_error(run("train --config " + ws.path("nope.yaml")), "nope.yaml");
    }
}

TEST_CASE("cli: bad data files are reported with their name", "[cli][bad-input]") {
    Workspace ws;
    auto shard = ws.read_bytes("train.bin");
    SECTION("no file matches") {
        require_clear_error(run(ws.train("--set data.train=" + ws.path("none*.bin"))),
                            "data.train");
    }
    SECTION("truncated") {
        shard.resize(shard.size() - 7);
        const auto p = ws.write_bytes("cut.bin", shard);
        require_clear_error(run(ws.train("--set data.train=" + p)), "truncated");
    }
    SECTION("shorter than the header") {
        shard.resize(100);
        const auto p = ws.write_bytes("cut.bin", shard);
        require_clear_error(run(ws.train("--set data.train=" + p)), "cut.bin");
    }
    SECTION("wrong magic") {
        shard[0] = 1;
        const auto p = ws.write_bytes("magic.bin", shard);
        require_clear_error(run(ws.train("--set data.train=" + p)), "not an llm.c token shard");
    }
    SECTION("token outside the vocabulary") {
        shard[1024 + 10] = 100;  // token 5 becomes 100 >= vocab 64
        const auto p = ws.write_bytes("vocab.bin", shard);
        require_clear_error(run(ws.train("--set data.train=" + p)), "outside the vocabulary");
    }
    SECTION("too few tokens for one sample") {
        trident::data::write_token_shard(ws.path("short.bin"), std::vector<uint16_t>(10, 1));
        require_clear_error(run(ws.train("--set data.train=" + ws.path("short.bin"))), "too few");
    }
}

TEST_CASE("cli: bad Megatron datasets and blends are reported", "[cli][bad-input][megatron]") {
    Workspace ws;
    const std::string prefix = ws.write_megatron("meg");
    SECTION("corrupt index") {
        auto idx = ws.read_bytes("meg.idx");
        idx[0] = 'X';
        ws.write_bytes("meg.idx", idx);
        require_clear_error(run(ws.train("--set data.train=" + prefix)),
                            prefix + ".idx: not a Megatron index");
    }
    SECTION("truncated index") {
        auto idx = ws.read_bytes("meg.idx");
        idx.resize(idx.size() - 3);
        ws.write_bytes("meg.idx", idx);
        require_clear_error(run(ws.train("--set data.train=" + prefix + ".bin")),
                            prefix + ".idx: header says");
    }
    SECTION("a bad blend item") {
        require_clear_error(
            run(ws.train("--set 'data.train=[{path: " + prefix + ", weight: 1}, {path: x}]'")),
            "data.train: item 2: missing weight");
    }
    SECTION("a missing dataset in a blend") {
        require_clear_error(
            run(ws.train("--set 'data.train=[{path: " + prefix +
                         ", weight: 1}, {path: " + ws.path("none") + ", weight: 1}]'")),
            "data.train[2]: no file matches");
    }
}

TEST_CASE("cli: a Megatron dataset trains exactly as a shard of the same tokens",
          "[cli][megatron]") {
    Workspace ws;
    const std::string prefix = ws.write_megatron("meg");
    const RunResult shard = run(ws.train("--set logging.metrics=" + ws.path("a.jsonl")));
    const RunResult megatron =
        run(ws.train("--set data.train=" + prefix + " --set data.valid=" + prefix + ".idx" +
                     " --set logging.metrics=" + ws.path("b.jsonl")));
    INFO(shard.output);
    INFO(megatron.output);
    REQUIRE(shard.exit_code == 0);
    REQUIRE(megatron.exit_code == 0);
    REQUIRE(megatron.output.find("data: Megatron dataset " + prefix) != std::string::npos);
    REQUIRE(megatron.output.find("val_loss") != std::string::npos);
    // The sampling contract sees one token stream either way: the same batches, the same losses.
    const auto losses = losses_of(ws.path("a.jsonl"));
    REQUIRE(losses.size() == 3);
    REQUIRE(losses == losses_of(ws.path("b.jsonl")));
}

TEST_CASE("cli: a weighted blend of an llm.c shard and a Megatron dataset trains",
          "[cli][megatron]") {
    Workspace ws;
    const std::string prefix = ws.write_megatron("meg");
    const std::string blend = "--set 'data.train=[{path: " + ws.path("train.bin") +
                              ", weight: 0.7}, {path: " + prefix + ", weight: 0.3}]'";
    const RunResult r = run(ws.train(blend + " --set logging.metrics=" + ws.path("a.jsonl")));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    REQUIRE(r.output.find("data: blend of 2: 70.0% llm.c shard") != std::string::npos);
    REQUIRE(r.output.find("; 30.0% Megatron dataset") != std::string::npos);
    REQUIRE(run(ws.train(blend + " --set logging.metrics=" + ws.path("b.jsonl"))).exit_code == 0);
    REQUIRE(losses_of(ws.path("a.jsonl")) == losses_of(ws.path("b.jsonl")));
}

TEST_CASE("cli: bad weights files are reported with their name", "[cli][bad-input]") {
    Workspace ws;
    SECTION("not a safetensors file") {
        const auto p = ws.write("w.safetensors", "this is not a safetensors file at all");
        require_clear_error(run(ws.train("--set model.init_from=" + p)), "w.safetensors");
    }
    SECTION("a model of another shape") {
        REQUIRE(run(ws.train("--set checkpoint.dir=" + ws.path("ck"))).exit_code == 0);
        REQUIRE(
            run("export --checkpoint " + ws.path("ck") + " --output " + ws.path("w.safetensors"))
                .exit_code == 0);
        require_clear_error(run(ws.train("--set model.init_from=" + ws.path("w.safetensors") +
                                         " --set model.hidden=64")),
                            "w.safetensors");
    }
    SECTION("missing checkpoint for export") {
        require_clear_error(
            run("export --checkpoint " + ws.path("none") + " --output x.safetensors"),
            "no checkpoint");
    }
}

TEST_CASE("cli: checkpoint.resume never refuses to overwrite earlier checkpoints",
          "[cli][bad-input]") {
    Workspace ws;
    const std::string ck = "--set checkpoint.dir=" + ws.path("ck");
    REQUIRE(run(ws.train(ck)).exit_code == 0);
    const fs::path saved = fs::path(ws.path("ck")) / "step_000003" / "manifest.json";
    REQUIRE(fs::exists(saved));
    const auto before = fs::last_write_time(saved);
    require_clear_error(run(ws.train(ck + " --set checkpoint.resume=never")),
                        "already holds checkpoints");
    require_clear_error(run(ws.train(ck + " --set checkpoint.resume=" + ws.path("nowhere"))),
                        "is not a checkpoint directory");
    REQUIRE(fs::last_write_time(saved) == before);
}

TEST_CASE("cli: exported weights load back with model.init_from", "[cli]") {
    Workspace ws;
    REQUIRE(run(ws.train("--set checkpoint.dir=" + ws.path("ck"))).exit_code == 0);
    const RunResult e =
        run("export --checkpoint " + ws.path("ck") + " --output " + ws.path("w.safetensors"));
    INFO(e.output);
    REQUIRE(e.exit_code == 0);
    const RunResult r = run(ws.train("--set model.init_from=" + ws.path("w.safetensors")));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    REQUIRE(r.output.find("weights: " + ws.path("w.safetensors")) != std::string::npos);
}
