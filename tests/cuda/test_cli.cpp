// The trident binary on the GPU: `device: cuda` trains as `device: cpu` does (the same losses
// to rounding), and two ranks sharing the one GPU (tensor parallel, then data parallel) take
// the MPI path with host staging, say so, and train as one rank does.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
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
        const auto at = line.find("\"loss\": ");
        REQUIRE(at != std::string::npos);
        losses.push_back(std::strtod(line.c_str() + at + 8, nullptr));
    }
    return losses;
}

void require_close(const std::vector<double>& a, const std::vector<double>& b, double tolerance) {
    REQUIRE(a.size() == b.size());
    REQUIRE(!a.empty());
    for (std::size_t i = 0; i < a.size(); ++i) {
        INFO("step " << i + 1 << ": " << a[i] << " against " << b[i]);
        REQUIRE(std::abs(a[i] - b[i]) <= tolerance * std::abs(b[i]));
    }
}

}  // namespace

TEST_CASE("cuda: trident train on the GPU, alone and as two ranks sharing it", "[cli]") {
    cli::Workspace ws;
    const std::string common = "--set model.dropout=0.1 --set logging.metrics=";
    const cli::RunResult cpu = run(ws.train("--set device=cpu " + common + ws.path("cpu.jsonl")));
    INFO(cpu.output);
    REQUIRE(cpu.exit_code == 0);
    const cli::RunResult gpu = run(ws.train("--set device=cuda " + common + ws.path("gpu.jsonl")));
    INFO(gpu.output);
    REQUIRE(gpu.exit_code == 0);
    REQUIRE(gpu.output.find("device: cuda") != std::string::npos);
    require_close(losses_of(ws.path("gpu.jsonl")), losses_of(ws.path("cpu.jsonl")), 1e-3);

    // auto takes the GPU when there is one.
    const cli::RunResult automatic = run(ws.train("--set device=auto"));
    REQUIRE(automatic.output.find("device: cuda (auto: ") != std::string::npos);

    for (const char* layout : {"parallel.tensor=2", "parallel.data=2"}) {
        INFO(layout);
        const std::string metrics =
            ws.path(std::string(layout).find("tensor") != std::string::npos ? "tensor.jsonl"
                                                                            : "data.jsonl");
        const cli::RunResult two = run_shell(
            std::string(TRIDENT_MPIEXEC) + " -n 2 " + TRIDENT_BINARY + " " +
            ws.train("--set device=cuda --set " + std::string(layout) + " " + common + metrics));
        INFO(two.output);
        REQUIRE(two.exit_code == 0);
        REQUIRE(two.output.find("communication: MPI through host memory") != std::string::npos);
        require_close(losses_of(metrics), losses_of(ws.path("gpu.jsonl")), 1e-3);
    }
}
