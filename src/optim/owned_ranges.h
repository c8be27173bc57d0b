// The parts of the trainable buffer this rank owns (data_parallel/data_parallel.h decides which),
// cut where the tensors they cover differ in what an update and the gradient norm ask of them:
// whether weight decay applies, whether this rank counts them in the norm (held once here, not
// a copy another rank speaks for: model/param_layout.h, held_elsewhere), whether they train,
// and whether they are a layer's weight matrix (what Muon steps whole, optim/muon.h).
#pragma once

#include <cstddef>
#include <vector>

#include "data_parallel/data_parallel.h"
#include "model/param_layout.h"

namespace trident::optim {

// A maximal run of owned elements of tensors alike.
struct OwnedRange {
    std::size_t offset, count;  // in the buffer
    std::size_t state;          // where its state starts (the owned parts' state, in order)
    bool decay, counted, trains;
    bool matrix = false;
    bool expert = false;  // a routed expert's (Split::expert), held by its expert rank alone
    // Where its state starts among the owned ranges of its group alone (the layer matrices,
    // or the rest), in order: for a state array an optimizer keeps for one group only
    // (optim/optimizer.h, StateGroup).
    std::size_t grouped = 0;
};

// Whether t is a 2-D weight of a layer (not of the embedding or the head) that trains: each
// Hugging Face tensor its own matrix (GPT-2's c_attn, c_proj, c_fc, mlp c_proj; Llama's q, k,
// v, o, gate, up, down).
bool is_layer_matrix(const model::ParamLayout& layout, const model::ParamTensor& t);

// A layout's trainable tensors in two groups: the layer matrices and the rest.
struct MatrixSplit {
    std::size_t matrices = 0, matrix_parameters = 0;
    std::size_t others = 0, other_parameters = 0;
};
MatrixSplit matrix_split(const model::ParamLayout& layout);

// In buffer order.
std::vector<OwnedRange> owned_ranges(const model::ParamLayout& layout,
                                     const std::vector<data_parallel::OwnedPart>& owned);

}  // namespace trident::optim
