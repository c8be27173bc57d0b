// The vocab-parallel token embedding plus the position embedding, the first global chunk's
// start: each tensor rank looks up the tokens of its slice of the vocabulary (zero rows for the
// rest) and the sum over the tensor group is the embedding (reduced to this rank's rows under
// sequence parallelism); wpe is added once, by tensor rank 0, so the sum is exact. Under
// context parallelism (or one position of generation, model/decoder.h) the positions are this
// rank's tokens' own (model/context_split.h), in the scratch the model fills
// (StageParts::positions). A llama model has no wpe.
//
// Shapes (this rank): tokens (B, T) i32; out (R, H) = the chunk's input; wte (Vm, H) rows
// [vocab_begin, vocab_begin + Vm) of the padded vocabulary, wpe (seq_len, H).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/activation_store.h"
#include "model/buffer_spec.h"
#include "model/part_context.h"

namespace trident::model {

struct EmbeddingSpec {
    std::size_t wte = 0, wpe = 0;  // offsets in the parameter buffer (wpe kNoParam: none)
    int vocab_begin = 0;
    float dropout = 0;
};

class Embedding {
public:
    // Declares its buffers into the chunk's set and the scratch.
    Embedding(const EmbeddingSpec& spec, const Dims& d, SetSpec& set, ScratchSpec& scratch);

    // out (R, H) from the host's token ids (B, T).
    void forward(PartContext& ctx, const Pass& pass, const int32_t* tokens, kernels::Ptr out) const;
    // The gradients of wte and wpe from d_out (R, H), or (BackwardPart::input) d_out kept for
    // backward_weight: the embedding has no input to pass a gradient on to.
    void backward(PartContext& ctx, const Pass& pass, kernels::ConstPtr d_out,
                  BackwardPart part) const;
    void backward_weight(PartContext& ctx, const Pass& pass) const;

private:
    void gradient(PartContext& ctx, const Pass& pass, kernels::ConstPtr d_out) const;
    const int32_t* positions(const PartContext& ctx) const;

    EmbeddingSpec spec_;
    int tokens_, partial_;       // slots: (N) i32; (N, H) partial sums
    WeightGradStash stash_;      // d_out (R, H), kept by a split backward
    int positions_ = -1;         // scratch: (T) i32, when T < seq_len only
    int d_rows_, d_output_all_;  // scratch: (R, H); (N, H) under sequence parallelism
    int ring_sums_;              // scratch: the reduce-scatter's running sums (2, R, H)
};

}  // namespace trident::model
