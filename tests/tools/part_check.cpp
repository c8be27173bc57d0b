// trident_part_check: one part of the model on its own, for the part-level tests
// (tests/python/test_parts.py, through tests/python/part_harness.py): a linear (column- or
// row-split), a norm, an attention, an MLP (each of the kinds model/part_registry.cpp lists),
// the embedding, or the LM head with its loss, built as the model builds it (its kind's
// declarations and build function, model/part_kinds.h) over a one-layer model's layout.
//
// Reads --input (safetensors, F32): the whole model's tensors the part declares, by their
// names, and its inputs: "x" (N, in) and "dy" (N, out) for a linear or a layer's part, "tokens"
// (N) for the embedding and "dy" (N, H), "x" (N, H) and "targets" (N) for the head (ids as
// floats). Runs its forward and its backward on this rank's part (under mpirun, the ranks are
// the tensor group: M = the world's size, the part split as the model splits it), and writes
// --output (rank 0): "y" (the output, whole), "dx" (the input's gradient, whole; none for the
// embedding), "grad/NAME" (each of the part's tensors' gradients, whole) and, for the head,
// "loss" (the mean over the rows).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "kernels/error.h"
#include "kernels/ops.h"
#include "parallel/grid.h"
#include "parallel/world.h"
#include "part_runner.h"

using namespace trident;

int main(int argc, char** argv) {
    CLI::App app{"One part of the model on its own, for the part-level tests"};
    test::PartCase c;
    std::string input, output;
    bool moe_sigmoid = false;
    app.add_option("--part", c.part,
                   "linear:column, linear:row, norm:KIND, attention:KIND, "
                   "mlp:KIND, embedding or head")
        ->required();
    app.add_option("--arch", c.arch, "gpt2 or llama: the family whose names the part takes");
    app.add_option("--vocab", c.shape.vocab);
    app.add_option("--seq", c.shape.max_seq);
    app.add_option("--hidden", c.shape.hidden);
    app.add_option("--heads", c.shape.heads);
    app.add_option("--kv-heads", c.shape.kv_heads);
    app.add_option("--ffn", c.shape.ffn);
    app.add_option("--batch", c.batch);
    // mlp:moe: model.moe's settings (model/moe_settings.h).
    app.add_option("--moe-experts", c.shape.moe.experts);
    app.add_option("--moe-top-k", c.shape.moe.top_k);
    app.add_option("--moe-ffn", c.shape.moe.ffn_hidden);
    app.add_option("--moe-shared", c.shape.moe.shared_experts);
    app.add_option("--moe-sigmoid", moe_sigmoid, "a sigmoid router (else softmax)");
    app.add_option("--moe-normalize", c.shape.moe.normalize_top_k);
    app.add_option("--moe-scale", c.shape.moe.scale);
    app.add_option("--sequence-parallel", c.sequence_parallel);
    app.add_option("--tp-overlap", c.tp_overlap,
                   "with --sequence-parallel: the overlapped exchanges");
    app.add_option("--input", input)->required();
    app.add_option("--output", output)->required();
    CLI11_PARSE(app, argc, argv);
    if (moe_sigmoid) c.shape.moe.router = model::MoeRouter::sigmoid;
    parallel::World world(argc, argv);
    try {
        parallel::GridShape grid_shape;
        grid_shape.tensor = world.size();
        parallel::Grid grid(world, grid_shape);
        const io::SafetensorsFile file = io::SafetensorsFile::open(input);
        std::map<std::string, std::vector<float>> inputs;
        for (const io::TensorInfo& info : file.tensors())
            inputs[info.name] = file.read_f32(info.name);
        auto ops = kernels::make_cpu_ops(1);
        const std::map<std::string, std::vector<float>> out =
            test::run_part(*ops, c, inputs, grid.tensor());
        if (grid.rank() != 0) return 0;
        std::vector<io::TensorToWrite> tensors;
        for (const auto& [name, values] : out)
            tensors.push_back({name, {static_cast<int64_t>(values.size())}, values.data()});
        io::write_safetensors(output, tensors);
    } catch (const std::exception& e) {
        return parallel::report_failure(world, e.what(), parallel::FailureKind::this_rank);
    }
    return 0;
}
