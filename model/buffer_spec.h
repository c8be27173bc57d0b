// The declarative description of the model's activation buffers: each part of the model
// (model/transformer_layer.h and the parts it is made of, the embedding, the head) declares,
// when it is built, the buffers one microbatch needs from it, with their sizes, types and
// what each is kept for. The activation store (model/activation_store.h) allocates sets from
// these specs under the recompute policy, and the planner (src/plan/memory_model.cpp) counts
// the same specs without allocating anything: what is planned is what is allocated, because
// both read one description (docs/ARCHITECTURE.md, "Activations").
//
// Two kinds of buffer:
// - per set: one per (microbatch, chunk) in flight, or in the one recompute scratch layer
//   that every set shares, as its Keep says;
// - scratch: one per model, shared by every part that names it (the largest size asked for
//   wins), for what a part needs only while it runs (a linear's partial output, the
//   gradients of the backward).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kernels/dtype.h"

namespace trident::model {

enum class Recompute { none, selective, full };

// What a buffer of a set is kept for, which decides where the recompute policy puts it.
enum class Keep {
    always,            // in every set: a layer's output (the next layer's input)
    unless_full,       // what backward reads; rebuilt by full recompute (into the scratch)
    unless_recompute,  // what attention keeps for backward; rebuilt by either recompute
    split,             // what a split backward's B keeps for its W (only when split)
    // What an attention's B keeps for its W: as split, and when its W waits for the next MoE
    // layer's exchange (KeepPolicy::defer_attention) in the shared scratch.
    deferrable,
};

struct BufferSpec {
    std::string name;  // for messages and the planner's report
    std::size_t count = 0;
    kernels::DType dtype = kernels::DType::f32;
    Keep keep = Keep::always;
};

// The buffers of one unit of a set (a layer, or a chunk's own buffers), in declaration
// order; a part keeps the slot it was given and finds its buffer there.
class SetSpec {
public:
    int add(std::string name, std::size_t count, kernels::DType dtype, Keep keep);
    // The split buffers declared from the `from`-th on become deferrable (an attention's).
    void make_deferrable(std::size_t from);
    const std::vector<BufferSpec>& buffers() const { return buffers_; }

private:
    std::vector<BufferSpec> buffers_;
};

// Where each Keep goes under a recompute policy.
struct KeepPolicy {
    Recompute recompute = Recompute::none;
    bool split_backward = false;
    // An attention's W may run under the next layer's exchange (parallel.ep_overlap): what it
    // reads waits in the shared scratch.
    bool defer_attention = false;
    // In each set, in the shared recompute scratch, or nowhere.
    bool in_set(Keep keep) const;
    bool in_scratch(Keep keep) const;
};

// Bytes of the buffers of `spec` that `where` selects.
template <typename Where>
std::size_t spec_bytes(const SetSpec& spec, Where where) {
    std::size_t bytes = 0;
    for (const BufferSpec& b : spec.buffers())
        if (where(b.keep)) bytes += b.count * kernels::size_of(b.dtype);
    return bytes;
}

// The model's shared scratch: a name is one buffer, of the largest count asked for.
class ScratchSpec {
public:
    int add(const std::string& name, std::size_t count, kernels::DType dtype);
    const std::vector<BufferSpec>& buffers() const { return buffers_; }
    std::size_t bytes() const;

private:
    std::vector<BufferSpec> buffers_;
};

}  // namespace trident::model
