// One rank's sizes of a microbatch, from which every part of the model sizes its buffers and
// the planner (src/plan/memory_model.cpp) counts them: computed once, by one function.
//
// Names: B sequences of T tokens each on this rank (T = seq_len / C under C-way context
// parallelism), N = B·T rows of a microbatch, R = the rows of the residual stream this rank
// holds (N / M under sequence parallelism, else N), H the hidden width, and the widths this
// rank holds under M-way tensor parallelism: Hm = H/M (attention), Fm = F/M (MLP), heads =
// NH/M, kv_heads = KVH/M (grouped-query attention's key/value heads; 1, a replica, when
// M > KVH), Vm = Vp/M (padded vocabulary).
#pragma once

#include <cstddef>

#include "kernels/dtype.h"
#include "model/param_layout.h"

namespace trident::model {

enum class ContextMode { ring, ulysses };

struct Dims {
    int B = 0, T = 0, seq_len = 0, N = 0, R = 0;
    int H = 0, Hm = 0, Fm = 0, heads = 0, kv_heads = 0, Vm = 0;
    int M = 1, tensor_rank = 0, C = 1;
    int expert_ranks = 1;  // the ranks an MoE layer's experts split over
    bool sequence_parallel = false;
    bool tp_overlap = false;  // sequence parallelism's exchanges overlap the GEMMs' pieces
    ContextMode context_mode = ContextMode::ring;
    kernels::DType act = kernels::DType::f32;  // activations' type

    std::size_t rows() const { return static_cast<std::size_t>(N); }
    std::size_t rows_mine() const { return static_cast<std::size_t>(R); }
    bool ring() const { return C > 1 && context_mode == ContextMode::ring; }
    bool ulysses() const { return C > 1 && context_mode == ContextMode::ulysses; }
};

// How the model is split and what it computes in: the inputs of make_dims.
struct DimsInputs {
    int micro_batch = 1;
    int M = 1, tensor_rank = 0;
    int C = 1;
    bool sequence_parallel = false;  // ignored on one tensor rank
    bool tp_overlap = false;         // ignored without sequence parallelism
    ContextMode context_mode = ContextMode::ring;
    kernels::DType activations = kernels::DType::f32;
    int expert_ranks = 1;  // the expert group's size (model/moe_dispatch.h)
};

// Throws trident::Error when sequence parallelism cannot split the rows evenly.
Dims make_dims(const GptShape& shape, const DimsInputs& in);

}  // namespace trident::model
