// One part of the model run on its own, on this rank of a tensor group: the part-level tests'
// harness (tests/tools/part_check.cpp for the PyTorch comparisons, tests/test_parts.cpp;
// part_runner.cpp runs it).
//
// The part is built as the model builds it: by the kind its one-layer model's spec names
// (model/part_kinds.h), over that model's layout on this tensor rank (its declared tensors
// loaded from whole ones, each rank its slice), with the model's own exchanges over the tensor
// group. Inputs and results are whole, named tensors (Tensors): a new part's first test is one
// more case of the same run.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/device_buffer.h"
#include "kernels/error.h"
#include "kernels/ops.h"
#include "model/context_split.h"
#include "model/embedding.h"
#include "model/lm_head.h"
#include "model/mlp.h"
#include "model/norm.h"
#include "model/self_attention.h"
#include "model/stage_parts.h"
#include "parallel/solo_comm.h"

namespace trident::test {

using Tensors = std::map<std::string, std::vector<float>>;

struct PartCase {
    // linear:column, linear:row (the GELU MLP's c_fc and c_proj alone), norm:KIND,
    // attention:KIND, mlp:KIND, embedding, or head (the final norm, LM head and loss).
    std::string part;
    std::string arch = "gpt2";  // the family: its names, its norms and attention
    model::GptShape shape;      // one layer of it
    int batch = 1;
    bool sequence_parallel = false;
    bool tp_overlap = false;  // sequence parallelism's exchanges overlapped (parallel.tp_overlap)
    const model::GemmPolicy* gemm = nullptr;  // the layer's linears' (null: dense)
};

namespace part_runner {

using kernels::ConstPtr;
using kernels::Ptr;

// The world of one part: its layout on this rank, its buffers, and the context its calls take.
struct Bench {
    model::ParamLayout layout, whole, no_lora;
    model::Dims d;
    model::TensorRows rows;
    parallel::SoloComm alone;
    model::Weights weights;
    model::SetSpec set;
    model::ScratchSpec scratch_spec;
    model::PartOptions options;

    Bench(kernels::Ops& ops, const model::GptShape& shape, const PartCase& c,
          parallel::Comm& tensor)
        : layout(shape, tensor.rank(), tensor.size()),
          whole(shape),
          no_lora(model::ParamLayout::for_lora(shape, {})),
          d(model::make_dims(
              shape,
              model::DimsInputs{c.batch, tensor.size(), tensor.rank(), 1, c.sequence_parallel,
                                c.tp_overlap, model::ContextMode::ring, kernels::DType::f32})),
          rows(ops, tensor, d, model::context_positions(shape.max_seq, 1, 0)),
          options{0.0f, {}, kernels::cpu_attention_saved, {}, c.gemm} {
        weights.params = model::FlatBuffer(ops, layout.total(), kernels::DType::f32);
        weights.grads = model::FlatBuffer(ops, layout.total(), kernels::DType::f32);
    }

    model::PartBuild build(const std::vector<std::size_t>& tensors) {
        return model::PartBuild{layout.spec(), d, tensors, 0, &no_lora, options, set, scratch_spec};
    }
};

// The whole shape of the case: one layer, the family's, the vocabulary padded for M ranks.
inline model::GptShape case_shape(const PartCase& c, int M) {
    model::GptShape s = c.shape;
    s.layers = 1;
    s.arch = c.arch == "llama" ? model::Arch::llama : model::Arch::gpt2;
    s.tied = s.arch == model::Arch::gpt2;
    s.padded_vocab = (s.vocab + 128 * M - 1) / (128 * M) * (128 * M);
    if (c.part.rfind("mlp:", 0) == 0) s.mlp = c.part.substr(4);
    if (c.part.rfind("linear:", 0) == 0) s.mlp = "gelu";  // its c_fc and c_proj
    return s;
}

inline const std::vector<float>& input(const Tensors& in, const std::string& name) {
    const auto it = in.find(name);
    if (it == in.end()) throw Error("part_check: no input \"" + name + "\"");
    return it->second;
}

// The whole tensors of `in` named as the layout's, each rank's slice of them loaded.
inline void load(Bench& b, const Tensors& in) {
    std::vector<float> whole(b.whole.total(), 0.0f), local(b.layout.total(), 0.0f);
    for (const model::ParamTensor& t : b.whole.tensors()) {
        const auto it = in.find(t.name);
        if (it == in.end()) continue;
        if (it->second.size() > t.numel) throw Error("part_check: " + t.name + " is too large");
        std::copy(it->second.begin(), it->second.end(), whole.begin() + t.offset);
    }
    model::shard_params(b.whole, whole.data(), b.layout, local.data());
    b.weights.params.from_host(local);
}

// Columns [rank·w, rank·w + w) of every row of a whole (rows, w·M), and back: the slices of
// every rank put together.
inline std::vector<float> columns_of(const std::vector<float>& all, std::size_t rows, std::size_t w,
                                     int rank) {
    std::vector<float> mine(rows * w);
    const std::size_t whole = all.size() / rows;
    for (std::size_t r = 0; r < rows; ++r)
        std::copy_n(all.begin() + r * whole + rank * w, w, mine.begin() + r * w);
    return mine;
}

inline std::vector<float> put_together(parallel::Comm& tensor, const std::vector<float>& mine,
                                       std::size_t rows) {
    const std::size_t M = static_cast<std::size_t>(tensor.size()), w = mine.size() / rows;
    std::vector<float> all(mine.size() * M), whole(mine.size() * M);
    tensor.all_gather(mine.data(), all.data(), mine.size());
    for (std::size_t q = 0; q < M; ++q)
        for (std::size_t r = 0; r < rows; ++r)
            std::copy_n(all.begin() + q * mine.size() + r * w, w,
                        whole.begin() + r * w * M + q * w);
    return whole;
}

// This rank's rows of a whole (N, w): all of them, or its block under sequence parallelism.
inline std::vector<float> rows_of(const Bench& b, const std::vector<float>& all, std::size_t w,
                                  int rank) {
    const std::size_t R = b.d.rows_mine(), first = b.d.sequence_parallel ? rank * R : 0;
    return {all.begin() + first * w, all.begin() + (first + R) * w};
}

inline std::vector<float> whole_rows(const Bench& b, parallel::Comm& tensor,
                                     const std::vector<float>& mine) {
    if (!b.d.sequence_parallel) return mine;
    std::vector<float> all(mine.size() * static_cast<std::size_t>(tensor.size()));
    tensor.all_gather(mine.data(), all.data(), mine.size());
    return all;
}

}  // namespace part_runner

// Runs the case's part forward and backward (BackwardPart::both) on `inputs`, and returns its
// results whole (see tests/tools/part_check.cpp for the names). Collective over `tensor`.
Tensors run_part(kernels::Ops& ops, const PartCase& c, const Tensors& inputs,
                 parallel::Comm& tensor);

}  // namespace trident::test
