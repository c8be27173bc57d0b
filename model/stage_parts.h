// The parts of one pipeline stage of the model, each built by the kind its spec names
// (model/model_spec.h, model/part_kinds.h), and the buffers they declare: the
// embedding (on the stage of the first global chunk), this stage's transformer layers, the
// head (on the stage of the last global chunk), each chunk's own buffers and the shared
// scratch. The model (model/gpt.h) runs them; the planner (src/plan/memory_model.cpp) builds
// the same parts from the config and counts their buffers without allocating any.
#pragma once

#include <optional>
#include <vector>

#include "model/activation_store.h"
#include "model/attention_core.h"
#include "model/embedding.h"
#include "model/lm_head.h"
#include "model/param_layout.h"
#include "model/part_kinds.h"
#include "model/transformer_layer.h"

namespace trident::model {

struct StageParts {
    std::optional<Embedding> embedding;
    std::vector<TransformerLayer> layers;  // this stage's, chunk by chunk
    std::vector<std::size_t> chunk_first;  // index in `layers` of each local chunk's first
    std::optional<LmHead> head;
    std::vector<ChunkSpec> chunks;  // per local chunk
    std::vector<int> chunk_input;   // each chunk's input (R, H): a slot of its own set
    // each chunk's documents (Documents::elements) i32, a slot of its own set; -1: none
    std::vector<int> chunk_documents;
    ScratchSpec scratch;
    int d_residual = 0;  // scratch: the backward's gradient of the residual stream (R, H)
    // scratch: this rank's tokens' positions in the whole sequence (T) i32, which the model
    // uploads once (generation's decoder: each step's); -1 when T = seq_len (0 .. T-1)
    int positions = -1;

    const TransformerLayer& layer(int c, int i) const {
        return layers[chunk_first[static_cast<std::size_t>(c)] + static_cast<std::size_t>(i)];
    }
    // Every layer's spec, chunk by chunk.
    std::vector<const SetSpec*> layer_specs() const;
};

// `lora_layout`: ParamLayout::for_lora of the same rank and stage (empty without adapters).
StageParts build_stage(const ParamLayout& layout, const ParamLayout& lora_layout, const Dims& d,
                       const PartOptions& options);

}  // namespace trident::model
