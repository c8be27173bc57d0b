// What the parts of the model (the linears, norms, attention, MLP, embedding and head) share
// while they run: the backend, this rank's rows and the tensor group, the parameter and
// gradient buffers, the shared scratch, and one microbatch's pass (its buffers, dropout seeds
// and which gradients its backward computes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/device_buffer.h"
#include "kernels/ops.h"
#include "kernels/random.h"
#include "model/buffer_spec.h"
#include "model/flat_buffer.h"
#include "model/tensor_rows.h"

namespace trident::model {

class Documents;  // model/documents.h

// The flat buffers parts read their parameters from and add their gradients into. Under LoRA
// the model is frozen (no gradients of its own) and the adapters have theirs.
struct Weights {
    FlatBuffer params, grads;
    FlatBuffer lora_params, lora_grads;
    bool frozen = false;
};

// The shared scratch of a model (model/buffer_spec.h, ScratchSpec), by slot.
class Scratch {
public:
    Scratch() = default;
    Scratch(kernels::Ops& ops, const std::vector<BufferSpec>& spec);
    kernels::Ptr operator[](int slot) const {
        return buffers_[static_cast<std::size_t>(slot)].data();
    }

private:
    std::vector<kernels::DeviceBuffer> buffers_;
};

// The balancing and z losses of a mixture of experts' layers (model/moe_mlp.cpp), summed over
// the layers and microbatches of this stage's training forwards, until the trainer takes them;
// and the choices each expert of each layer received (every token's k counted, those a capacity
// dropped too) and those dropped, summed over the microbatches.
struct MoeLossSums {
    double aux = 0, z = 0;
    std::vector<double> tokens;   // (layers, experts) as far as a layer counted; 0 elsewhere
    std::vector<double> dropped;  // (layers): the choices a capacity dropped, alike
};

// Work that may wait for the next exchange (parallel.ep_overlap): the weight gradients of an
// attention whose layer lies above an MoE layer, and what completes its layer's gradients. The
// MoE layer's backward runs it while its dispatch travels (model/moe_mlp.cpp); the model runs
// what is left at the end of a chunk's backward (model/gpt.cpp). One waits at a time.
class Deferred {
public:
    void set(std::function<void()> work);
    // Runs the work waiting, if any, once.
    void run();
    explicit operator bool() const { return static_cast<bool>(work_); }

private:
    std::function<void()> work_;
};

struct PartContext {
    kernels::Ops& ops;
    const TensorRows& rows;   // and the tensor group
    parallel::Comm& context;  // the context group (a group of one without the split)
    // The tensor ranks holding this rank's key/value head when M > KVH (else this rank alone).
    parallel::Comm& kv_replicas;
    Weights& weights;
    const Scratch& scratch;
    MoeLossSums* moe_losses = nullptr;  // none: not counted (a part alone, generation)
    // The expert group (model/moe_dispatch.h); none: this rank computes every expert.
    parallel::Comm* experts = nullptr;
    // The work the next exchange may run under it; none: nothing is deferred.
    Deferred* deferred = nullptr;
    const Dims& dims() const { return rows.dims(); }
};

// Which gradients a backward computes: all (the plain backward), the inputs' only (a split
// backward's B, which keeps what W needs), or the parameters' only from what B kept (W).
enum class BackwardPart { both, input, weight };

// One buffer of each slot of a part's set (model/activation_store.h): in the set of the
// microbatch at hand, or in the recompute scratch.
class SetBuffers {
public:
    explicit SetBuffers(std::vector<kernels::Ptr> buffers) : buffers_(std::move(buffers)) {}
    kernels::Ptr operator[](int slot) const { return buffers_[static_cast<std::size_t>(slot)]; }

private:
    std::vector<kernels::Ptr> buffers_;
};

// One microbatch's pass through a layer (or the embedding and head, layer -1 and L).
struct Pass {
    const SetBuffers& buffers;
    bool training = false;  // dropout applies
    uint64_t seed = 0;      // the microbatch's dropout seed
    int layer = 0;          // global index
    // The microbatch's packed documents (model/documents.h), or null: one causal sequence.
    const Documents* documents = nullptr;
    // The backward's weight of one token's loss (1 / tokens of the global batch, model/gpt.h),
    // for the losses a layer adds (a mixture of experts' balancing loss); 0 in the forward.
    float dloss = 0;

    float drop(float p) const { return training ? p : 0.0f; }
    // The seed of dropout site s of the layer: 0 attention, 1 and 2 the residual branches,
    // 3 the low-rank adapters.
    uint64_t site(int s) const {
        return kernels::hash64(seed,
                               static_cast<uint64_t>(layer + 1) * 4 + static_cast<uint64_t>(s));
    }
};

}  // namespace trident::model
