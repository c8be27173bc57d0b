// Where the pipeline cuts the layers: how many layers each of the P·v global chunks holds.
//
// Cutting by layer count alone (uniform) leaves the last chunk with the LM head and the loss
// besides its layers; on a model with a large vocabulary and few layers the head can be most
// of the FLOPs, and the last stage then sets the pace of the whole pipeline. `auto` balances
// the chunks by the GEMM FLOPs the model counts for them (model/flops.h): each
// layer goes, one at a time, to the chunk whose cost it raises least — for identical layers
// this minimises the largest chunk's cost. Memory-bound work (the embedding, LayerNorms, the
// softmax of the loss) is not counted. Ties go to the later chunk, which under 1F1B holds
// fewer microbatches' activations.
#pragma once

#include <vector>

#include "config/config.h"

namespace trident::config {

// Layers per chunk minimising the largest chunk cost, given the cost of one layer and the
// fixed extra cost of the first and of the last chunk (one chunk: both on it).
std::vector<int> balanced_layers(int layers, int chunks, double layer_cost, double first_extra,
                                 double last_extra);

// What the auto cut balances: the GEMM FLOPs of a layer and of the LM head, forward and
// backward, for one rank's microbatch (they depend on the model, parallel.tensor and context,
// training.micro_batch and recompute, not on P or v). cfg.derived.padded_vocab must be set.
struct CutCosts {
    double layer = 0, head = 0;
};
CutCosts cut_costs(const Config& cfg);

// The layers of each global chunk for the config's parallel.stage_layers (config::derive
// stores them as derived.chunk_layers). cfg.derived.padded_vocab must be set.
std::vector<int> chunk_layers(const Config& cfg);
// The same with an auto cut's costs given (cut_costs of a config that differs at most in P and
// v): a search cuts many pipelines of one microbatch shape.
std::vector<int> chunk_layers(const Config& cfg, const CutCosts& costs);

}  // namespace trident::config
