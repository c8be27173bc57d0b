// What the model shows the data-parallel module (src/data_parallel/data_parallel.h), and all it
// knows of it: its units, the events of a step on them, and how the module wants its buffers
// held. It knows nothing of ZeRO stages, hybrid sharding or offload; the module decides all of
// that and answers through these.
//
// A unit is a named run of the model's declared tensors (ParamLayout's units: the embedding,
// each layer, the head): its range in the trainable buffer (the model's own, or under low-rank
// adapters the adapters' of that layer) and, under adapters, its range in the frozen model's
// own buffer; under a 4-bit base sharded by units (model/nf4_base.h), its range in the base's
// quantized bytes.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

namespace trident::model {

using UnitRange = std::pair<std::size_t, std::size_t>;  // [begin, end) of a buffer

struct ModelUnit {
    std::string name;     // "embedding", "wte", "wpe", "h.3", "layers.3", "head"
    UnitRange trainable;  // in the trainable buffer; empty where it has none there
    UnitRange frozen;     // in the frozen model's own buffer; empty unless the model is frozen
    UnitRange codes;      // in a 4-bit base's bytes (Nf4Base::codes); empty unless sharded
    // Its gradient is one copy of two: a pipeline's tied token embedding, held by the first
    // and the last stage, whose sum over the embedding group is the gradient.
    bool shared = false;
};

// The two events of a step on the units, each with its end: a unit is needed for compute (its
// parameters read, from params_needed to params_done, `next` the unit read after it if any;
// its gradients added into, from grads_needed), and a unit's gradients are complete for now
// (nothing more is added until they are handed over). The model calls them in the order it
// computes, the same on every replica.
class UnitListener {
public:
    virtual ~UnitListener() = default;
    virtual void params_needed(std::size_t unit, const std::size_t* next) = 0;
    virtual void params_done(std::size_t unit) = 0;
    virtual void grads_needed(std::size_t unit) = 0;
    virtual void grads_complete(std::size_t unit) = 0;
};

// How the data-parallel module holds the model's flat buffers: whole (padded to a multiple of
// `multiple`), or cut into the layout's units, each aligned to `multiple`, and sharded over
// `multiple` replicas (this one `replica`): the gradients, and the parameters too; where the
// experts split (ParamLayout::expert_runs), each run of the experts held a unit of its own,
// sharded over the `expert_multiple` ranks holding the same experts (this one
// `expert_replica`). And when the gradients are handed over: after every microbatch's
// backward, or the step's last.
struct BufferPlan {
    std::size_t multiple = 1;
    int replica = 0;
    bool shard_grads = false, shard_params = false;
    bool grads_every_microbatch = false;
    std::size_t expert_multiple = 1;
    int expert_replica = 0;
};

}  // namespace trident::model
