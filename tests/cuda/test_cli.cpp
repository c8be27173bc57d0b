// The trident binary on the GPU: `device: cuda` trains as `device: cpu` does; two ranks sharing
// the one GPU take the MPI path with host staging, say so, and train as one rank does in every
// kind of parallelism (P, M and D of 2; C of 2 by ring attention and by Ulysses; ZeRO-2 and 3;
// the zero-bubble schedule; low-rank adapters); a tiny Llama trains as on the CPU, and over two
// ranks by ring attention; fp16 with loss scaling trains as on the CPU; a
// checkpoint written on the GPU resumes on the CPU and the reverse; the default job
// (configs/default.yaml, which needs the corpus that scripts/prepare_kjv.sh makes) and the
// GPT-2 124M benchmark run on the GPU; optimizer.offload (host, nvme, and ZeRO-3's shard in a
// file) trains as none does, with AdamW and with Muon.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/cli_support.h"

using cli::run;
using cli::run_shell;

namespace {

std::vector<double> losses_of(const std::string& metrics_path) {
    std::ifstream in(metrics_path);
    std::vector<double> losses;
    for (std::string line; std::getline(in, line);) {
        // A line of its own for each validation: {"step": N, "val_loss": ...}.
        const auto at = line.find("\"loss\": ");
        if (at == std::string::npos) {
            REQUIRE(line.find("\"val_loss\": ") != std::string::npos);
            continue;
        }
        losses.push_back(std::strtod(line.c_str() + at + 8, nullptr));
    }
    return losses;
}

void require_close(const std::vector<double>& a, const std::vector<double>& b, double tolerance) {
    REQUIRE(a.size() == b.size());
    REQUIRE(!a.empty());
    double worst = 0;  // printed for scripts/gpu_verify.sh
    for (std::size_t i = 0; i < a.size(); ++i)
        worst = std::max(worst, std::abs(a[i] - b[i]) / std::abs(b[i]));
    std::printf("losses: %zu steps, worst relative difference %.3e (at most %.0e)\n", a.size(),
                worst, tolerance);
    for (std::size_t i = 0; i < a.size(); ++i) {
        INFO("step " << i + 1 << ": " << a[i] << " against " << b[i]);
        REQUIRE(std::abs(a[i] - b[i]) <= tolerance * std::abs(b[i]));
    }
}

// Open MPI's launcher for two ranks: the build's, or TRIDENT_TEST_MPIEXEC's (a carried build).
std::string mpiexec() {
    const char* carried = std::getenv("TRIDENT_TEST_MPIEXEC");
    return carried ? carried : TRIDENT_MPIEXEC;
}

cli::RunResult checked(const std::string& args) {
    const cli::RunResult r = run(args);
    INFO(args << "\n" << r.output);
    REQUIRE(r.exit_code == 0);
    return r;
}

// A GPU run in fp32 with true fp32 products (training.tf32=false) differs from the CPU's, and
// from another layout's, in the order of its additions only: 1e-4 of the loss over a few steps.
constexpr double kFp32 = 1e-4;

}  // namespace

TEST_CASE("cuda: trident train on the GPU, alone and as two ranks sharing it", "[cli]") {
    cli::Workspace ws;
    const std::string common =
        "--set model.dropout=0.1 --set training.tf32=false --set "
        "logging.metrics=";
    checked(ws.train("--set device=cpu " + common + ws.path("cpu.jsonl")));
    const cli::RunResult gpu =
        checked(ws.train("--set device=cuda " + common + ws.path("gpu.jsonl")));
    REQUIRE(gpu.output.find("device: cuda") != std::string::npos);
    REQUIRE(gpu.output.find("GPU libraries: driver") != std::string::npos);
    REQUIRE(gpu.output.find("attention (") != std::string::npos);
    require_close(losses_of(ws.path("gpu.jsonl")), losses_of(ws.path("cpu.jsonl")), kFp32);

    // auto takes the GPU when there is one.
    const cli::RunResult automatic = run(ws.train("--set device=auto"));
    REQUIRE(automatic.output.find("device: cuda (auto: ") != std::string::npos);

    for (const char* layout : {"pipeline", "tensor", "data"}) {
        INFO(layout << " parallelism over two ranks sharing the GPU");
        const std::string metrics = ws.path(std::string(layout) + ".jsonl");
        const cli::RunResult two =
            run_shell(mpiexec() + " -n 2 " + cli::binary() + " " +
                      ws.train("--set device=cuda --set parallel." + std::string(layout) + "=2 " +
                               common + metrics));
        INFO(two.output);
        REQUIRE(two.exit_code == 0);
        REQUIRE(two.output.find("communication: MPI through host memory") != std::string::npos);
        require_close(losses_of(metrics), losses_of(ws.path("gpu.jsonl")), kFp32);
    }
}

// A tiny Llama (RMSNorm, rotary positions, SwiGLU, 4 query heads sharing 2 key/value heads)
// trains on the GPU as on the CPU, in fp32 and in bf16; and with context parallelism by ring
// attention over two ranks sharing the GPU (each rank's rows rotated at their positions in the
// whole sequence) as one rank does.
TEST_CASE("cuda: a tiny llama trains on the GPU as on the CPU", "[cli]") {
    cli::Workspace ws;
    const std::string common =
        "--set model.arch=llama --set model.kv_heads=2 --set model.dropout=0.1 "
        "--set training.tf32=false ";
    const auto losses = [&](const std::string& name, const std::string& settings) {
        checked(ws.train(common + settings + " --set logging.metrics=" + ws.path(name)));
        return losses_of(ws.path(name));
    };
    const std::vector<double> gpu = losses("gpu.jsonl", "--set device=cuda");
    require_close(gpu, losses("cpu.jsonl", "--set device=cpu"), kFp32);
    const std::string bf16 = "--set training.precision=bf16 --set device=";
    require_close(losses("gpu_bf16.jsonl", bf16 + "cuda"), losses("cpu_bf16.jsonl", bf16 + "cpu"),
                  2e-2);

    const std::string ring = ws.path("ring.jsonl");
    const cli::RunResult two =
        run_shell(mpiexec() + " -n 2 " + cli::binary() + " " +
                  ws.train(common +
                           "--set device=cuda --set parallel.context=2 --set "
                           "parallel.context_mode=ring --set logging.metrics=" +
                           ring));
    INFO(two.output);
    REQUIRE(two.exit_code == 0);
    require_close(losses_of(ring), gpu, kFp32);
}

// Every other kind of parallelism over two ranks sharing the GPU, each against one rank on it:
// context parallelism by ring attention (the block kernels, the ring's messages) and by Ulysses
// (the all-to-alls), ZeRO-2 and 3 (sharded gradients and weights), the zero-bubble schedule
// (the split backward), and low-rank adapters (from a checkpoint trained here); and fp16 with
// its loss scaling against the CPU.
TEST_CASE("cuda: two ranks sharing the GPU in each other layout train as one", "[layouts]") {
    cli::Workspace ws;
    const std::string common =
        "--set device=cuda --set model.dropout=0.1 --set training.tf32=false";
    const auto train = [&](int ranks, const std::string& name, const std::string& extra) {
        const std::string args =
            ws.train(common + " " + extra + " --set logging.metrics=" + ws.path(name + ".jsonl"));
        const cli::RunResult r =
            ranks == 1 ? run(args) : run_shell(mpiexec() + " -n 2 " + cli::binary() + " " + args);
        INFO(name << ": " << args << "\n" << r.output);
        REQUIRE(r.exit_code == 0);
        if (ranks == 2)
            REQUIRE(r.output.find("communication: MPI through host memory") != std::string::npos);
        return losses_of(ws.path(name + ".jsonl"));
    };
    const std::vector<double> one = train(1, "one", "--set checkpoint.dir=" + ws.path("base"));
    struct Layout {
        const char* name;
        const char* settings;
    };
    for (const Layout& layout :
         {Layout{"ring", "--set parallel.context=2 --set parallel.context_mode=ring"},
          Layout{"ulysses", "--set parallel.context=2 --set parallel.context_mode=ulysses"},
          Layout{"zero2", "--set parallel.data=2 --set parallel.zero_stage=2"},
          Layout{"zero3", "--set parallel.data=2 --set parallel.zero_stage=3"},
          Layout{"zb-h1", "--set parallel.pipeline=2 --set parallel.schedule=zb-h1"}}) {
        INFO(layout.name << " over two ranks sharing the GPU against one rank");
        require_close(train(2, layout.name, layout.settings), one, kFp32);
    }
    // Adapters on the model trained above, as one rank and as two data-parallel ranks.
    const std::string lora = "--set model.init_from=" + ws.path("base") +
                             " --set training.lora.rank=4 --set training.lora.dropout=0.1";
    const std::vector<double> lora_one = train(1, "lora_one", lora);
    INFO("LoRA over two data-parallel ranks sharing the GPU against one rank");
    require_close(train(2, "lora_two", lora + " --set parallel.data=2"), lora_one, kFp32);

    // fp16 with dynamic loss scaling, on the GPU and on the CPU.
    const std::string fp16 = "--set training.precision=fp16";
    const std::vector<double> gpu_fp16 = train(1, "fp16_gpu", fp16);
    const std::vector<double> cpu_fp16 = train(1, "fp16_cpu", fp16 + " --set device=cpu");
    INFO("fp16 with loss scaling, the GPU against the CPU");
    require_close(gpu_fp16, cpu_fp16, 2e-2);
}

TEST_CASE("cuda: a checkpoint written on the GPU resumes on the CPU, and the reverse",
          "[checkpoint]") {
    for (const char* precision : {"fp32", "bf16"}) {
        const double tolerance = std::string(precision) == "fp32" ? kFp32 : 2e-2;
        for (const char* writer : {"cuda", "cpu"}) {
            const std::string reader = std::string(writer) == "cuda" ? "cpu" : "cuda";
            INFO(precision << ": written by " << writer << ", resumed on " << reader);
            cli::Workspace ws;
            // The whole run keeps a checkpoint every 3 steps; the other device resumes from the
            // first and must give the whole run's last 3 losses.
            const std::string common = "--set training.precision=" + std::string(precision) +
                                       " --set training.steps=6 --set model.dropout=0.1" +
                                       " --set training.tf32=false";
            checked(ws.train(common + " --set device=" + writer + " --set checkpoint.dir=" +
                             ws.path("ck") + " --set checkpoint.interval=3" +
                             " --set logging.metrics=" + ws.path("whole.jsonl")));
            const std::string half = ws.path("ck") + "/step_000003";
            const cli::RunResult resumed = checked(
                ws.train(common + " --set device=" + reader + " --set checkpoint.resume=" + half +
                         " --set checkpoint.dir=" + ws.path("ck2") +
                         " --set logging.metrics=" + ws.path("resumed.jsonl")));
            REQUIRE(resumed.output.find("resumed: " + half + " at step 3") != std::string::npos);
            const std::vector<double> whole = losses_of(ws.path("whole.jsonl"));
            REQUIRE(whole.size() == 6);
            require_close(losses_of(ws.path("resumed.jsonl")),
                          std::vector<double>(whole.begin() + 3, whole.end()), tolerance);
        }
    }
}

// The host-side Adam runs the CPU backend's element loop, the device-resident update the CUDA
// kernel: the same formula, with fused multiply-adds placed by two compilers, so the two are
// compared as the GPU and the CPU are, not bitwise (on the CPU backend they are bitwise:
// tests/python/test_offload_host.py).
TEST_CASE("cuda: optimizer.offload: host trains as none on the GPU", "[offload]") {
    for (const char* precision : {"fp32", "bf16"}) {
        INFO(precision);
        cli::Workspace ws;
        const std::string common = "--set device=cuda --set training.tf32=false" +
                                   std::string(" --set training.precision=") + precision +
                                   " --set logging.metrics=";
        checked(ws.train(common + ws.path("none.jsonl")));
        const cli::RunResult host =
            checked(ws.train(common + ws.path("host.jsonl") + " --set optimizer.offload=host"));
        REQUIRE(host.output.find("optimizer state in page-locked host memory") !=
                std::string::npos);
        require_close(losses_of(ws.path("host.jsonl")), losses_of(ws.path("none.jsonl")),
                      std::string(precision) == "fp32" ? kFp32 : 2e-2);
    }
}

// Muon's momentum off the device: its input to the whole-matrix step by the host loop
// (Optimizer::matrix_input_host) against the CUDA kernel's on device-resident state.
TEST_CASE("cuda: Muon with optimizer.offload: host trains as none on the GPU", "[offload]") {
    cli::Workspace ws;
    const std::string common =
        "--set device=cuda --set training.tf32=false --set optimizer.name=muon "
        "--set logging.metrics=";
    checked(ws.train(common + ws.path("none.jsonl")));
    checked(ws.train(common + ws.path("host.jsonl") + " --set optimizer.offload=host"));
    require_close(losses_of(ws.path("host.jsonl")), losses_of(ws.path("none.jsonl")), kFp32);
}

// nvme streams the state through the same CUDA kernel as device-resident state, and ZeRO-3's
// shard in a file (optimizer.offload_params) gathers what the shard in memory would: the
// losses of none, as the CPU backend's are bitwise (tests/python/test_offload.py,
// test_offload_params.py); compared here to kFp32, the GPU's run-to-run bound.
TEST_CASE("cuda: the optimizer state and ZeRO-3's shard in files train as none on the GPU",
          "[offload]") {
    cli::Workspace ws;
    const std::string dir = ws.path("offload");
    std::filesystem::create_directories(dir);
    const std::string common =
        "--set device=cuda --set training.tf32=false "
        "--set optimizer.offload_chunk=4000 --set logging.metrics=";
    const std::string nvme = " --set optimizer.offload=nvme --set optimizer.offload_dir=" + dir;
    const std::string zero3 = " --set parallel.zero_stage=3";
    checked(ws.train(common + ws.path("none.jsonl")));
    checked(ws.train(common + ws.path("nvme.jsonl") + nvme));
    require_close(losses_of(ws.path("nvme.jsonl")), losses_of(ws.path("none.jsonl")), kFp32);
    checked(ws.train(common + ws.path("zero3.jsonl") + zero3));
    checked(ws.train(common + ws.path("params.jsonl") + zero3 + nvme +
                     " --set optimizer.offload_params=true"));
    require_close(losses_of(ws.path("params.jsonl")), losses_of(ws.path("zero3.jsonl")), kFp32);
    CHECK(std::filesystem::is_empty(dir));  // the files are scratch, removed at exit
}

TEST_CASE("cuda: the default job trains on the GPU", "[default-job]") {
    const std::string root = cli::source_dir(), corpus = root + "/data/kjv/gpt2";
    INFO("the default job reads " << corpus << "/{train,valid}.bin: make them with "
                                  << "scripts/prepare_kjv.sh, or bring that folder along");
    REQUIRE(std::filesystem::exists(corpus + "/train.bin"));
    REQUIRE(std::filesystem::exists(corpus + "/valid.bin"));
    cli::Workspace ws;
    // As scripts/run.sh runs it, from the repository root, but keeping its metrics here.
    const cli::RunResult job = run_shell(
        "cd " + root + " && TRIDENT_TOKENIZER_DIR=" + root + "/data/gpt2 " + cli::binary() +
        " train --config configs/default.yaml --set logging.metrics=" + ws.path("default.jsonl"));
    INFO(job.output);
    REQUIRE(job.exit_code == 0);
    REQUIRE(job.output.find("device: cuda (auto: ") != std::string::npos);
    const std::vector<double> losses = losses_of(ws.path("default.jsonl"));
    REQUIRE(losses.size() == 300);
    REQUIRE(losses.back() <
            losses.front() - 2.0);  // it learned (10.9 to 4.5 on a CPU, docs/PERF.md)
}

TEST_CASE("cuda: the GPT-2 124M benchmark runs on the GPU", "[bench]") {
    const cli::RunResult bench = checked("bench --config " + cli::source_dir() +
                                         "/configs/gpt2-124m.yaml --steps 3 --warmup 1");
    INFO(bench.output);
    REQUIRE(bench.output.find("device: cuda (auto: ") != std::string::npos);
    REQUIRE(bench.output.find("\"backend\": \"cuda\"") != std::string::npos);
    const auto at = bench.output.find("\"tokens_per_s\": ");
    REQUIRE(at != std::string::npos);
    REQUIRE(std::strtod(bench.output.c_str() + at + 16, nullptr) > 0.0);
}
